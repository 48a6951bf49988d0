"""The gateway: a stateless Starlette app under hypercorn that speaks the API families' wire formats
and drives one worker process per model over ZeroMQ.

Core (family-neutral), for every API family to use:
- lifecycle: the one request path (read the body within max_request_body_bytes, decode, convert,
  resolve, admit, submit, wait for Accepted, stream or collect, close), driven by a per-endpoint
  `Adapter`; its module doc says how a family plugs in.
- family: `Family` (path prefixes, routes, error envelope, status overrides) and the one status table.
- `app.state.models` (workers.ModelManager): `await get(name) -> ReplicaSet` (starts the model's
  workers, one per replica; GatewayError MODEL_NOT_FOUND / WORKER_UNAVAILABLE), `await resolve(name)`,
  `running()`, `await unload(name)`. `handle.submit(Submit) -> RequestStream` (routed to a replica,
  routing.py), `await handle.call(Tokenize(...)) -> TokenizeResult` (one Struct per helper call, on the
  least loaded replica), `handle.hello`.
- generation.Generation: one request's handle on its worker: open (until Accepted), events / collect
  (a Result of ordered typed parts), close (sync: aborts a request still running, records metrics
  and the request's log line).
- http: `new_id`, `client_request_id`, `until_disconnect`, `EventStreamResponse(on_close=)`, `JSONBody`.
- errors.GatewayError carries a protocol ErrorInfo; the family whose prefix a path has renders it.

A family package has `family() -> Family` in its `__init__` and is named in `app.FAMILIES`.
"""
