"""Messages and codec for the gateway <-> worker link (ZeroMQ ROUTER/DEALER, msgpack).

Pure: imports neither gateway nor worker. Messages speak engine terms only.
"""

from .messages import *  # noqa: F401,F403
from .messages import __all__ as _messages_all
from .codec import GatewayCodec, WorkerCodec

__all__ = [*_messages_all, "GatewayCodec", "WorkerCodec"]
