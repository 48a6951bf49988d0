"""One Encoder/Decoder per direction, built once per side."""

from __future__ import annotations

import msgspec

from .messages import FromWorker, ToWorker


class GatewayCodec:
    """The gateway's side: encodes ToWorker, decodes FromWorker."""

    __slots__ = ("_enc", "_dec")

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(FromWorker)

    def encode(self, msg: ToWorker) -> bytes:
        return self._enc.encode(msg)

    def decode(self, data: bytes) -> FromWorker:
        return self._dec.decode(data)


class WorkerCodec:
    """The worker's side: encodes FromWorker, decodes ToWorker."""

    __slots__ = ("_enc", "_dec")

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(ToWorker)

    def encode(self, msg: FromWorker) -> bytes:
        return self._enc.encode(msg)

    def decode(self, data: bytes) -> ToWorker:
        return self._dec.decode(data)
