"""structlog set-up for the services: JSON lines with a request id bound per call (contextvars)."""

import logging
import sys

import structlog


def configure_service_logging(service: str, level: str = "info", json: bool = True) -> None:
    """Called once by a service's entry point; every line carries `service` and any bound request_id."""
    numeric = logging.getLevelName(level.upper())

    def add_service(logger: object, method: str, event: dict) -> dict:  # every thread, not only the main one
        event.setdefault("service", service)
        return event

    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_service,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric if isinstance(numeric, int) else logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
