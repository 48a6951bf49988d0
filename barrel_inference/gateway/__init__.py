"""The gateway: a stateless Starlette app under hypercorn that speaks the API families' wire formats
and drives one worker process per model over ZeroMQ.

Core (family-agnostic), for every API family to use:
- `app.state.models` (workers.ModelManager): `await get(name) -> WorkerHandle` (starts the worker;
  GatewayError MODEL_NOT_FOUND / WORKER_UNAVAILABLE), `await resolve(name)`, `running()`,
  `await unload(name)`. `WorkerHandle.submit(Submit) -> RequestStream` (admission: OVERLOADED),
  `await handle.call(Call) -> CallResult`, `handle.hello` (n_ctx, chat template...).
- generation.Generation: `await Generation.open(app.state, api=, model=, submit=)` waits for the
  first event (so a rejected prompt is still an HTTP error), `events()` / `collect()`, `close()`
  (sync: aborts a request still running, records metrics and the request's log line).
- http: `new_id`, `client_request_id`, `until_disconnect`, `EventStreamResponse(on_close=)`, `JSONBody`.
- errors.GatewayError carries a protocol ErrorInfo; each family maps ErrorCode to its own status/body.

A family package has `routes() -> list[Route]` in its `routes` module, and may define
`async aclose(app)` there, which the app's lifespan calls at shutdown.
"""
