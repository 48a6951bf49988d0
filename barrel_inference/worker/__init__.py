"""The worker: one process per loaded model.

It owns the llama.cpp context (through worker.engine, the only module that imports llama_cpp),
the seq_id pool, continuous batching, sampling and grammars, chat templates and stop handling.

Started by the gateway as

    python -m barrel_inference.worker --bind ENDPOINT --model-path PATH --model-name NAME
        [--n-seq-max N] [--n-ctx N] [--n-batch N] [--n-ubatch N] [--threads N]
        [--prefill-chunk N] [--chat-template NAME_OR_JINJA] [--fake [--fake-tps F]]

It binds a ZeroMQ ROUTER at ENDPOINT (ipc:// or tcp://); gateways connect DEALER sockets and
send Connect, to which the worker answers Hello. `--fake` runs a fake engine (no model file) that
emits tokens as fast as asked, for gateway tests and overhead benchmarks.
"""
