"""Channel and server options used on both ends of every connection: message size limits, keepalive."""

MAX_MESSAGE_BYTES = 64 * 2**20  # tokenizer.json travels in TargetInfo (~2 MiB); q tensors at batch x K x V

_COMMON = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),  # ping an idle connection every 20 s
    ("grpc.keepalive_timeout_ms", 10_000),  # and drop it when the ping is not answered in 10 s
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

SERVER_OPTIONS = [*_COMMON, ("grpc.http2.min_ping_interval_without_data_ms", 10_000)]
CHANNEL_OPTIONS = [
    *_COMMON,
    ("grpc.enable_retries", 0),  # retries are the router's decision, not the channel's
    # reconnect fast: the default backoff grows to minutes, so a replica that starts slowly (or restarts)
    # would look down long after it serves
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
