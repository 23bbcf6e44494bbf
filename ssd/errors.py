"""Typed engine errors. Services map each class once to a transport status (gRPC / HTTP)."""


class SSDError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(SSDError, ValueError):
    """The caller asked for something malformed (bad prompt, bad sampling params)."""


class CheckpointError(SSDError):
    """A model folder is missing, incomplete, or not a checkpoint the engine can read."""


class UnsupportedModelError(CheckpointError):
    """The checkpoint's `model_type` has no implementation in the registry."""


class ModelNotFoundError(SSDError):
    """A model name is neither a folder nor a known / cached model."""


class FetchError(SSDError):
    """A package registry could not be reached or did not have the requested file."""


class UnknownSequenceError(SSDError, LookupError):
    """A call names a sequence this side does not hold (e.g. an Outcome for a sequence never prefilled)."""


class ResourceExhaustedError(SSDError):
    """The request can never fit (e.g. needs more KV blocks than the cache holds)."""


class PrefixUnavailableError(SSDError):
    """A request relies on cached state this process does not hold (e.g. a draft's prefix blocks); resend it whole."""


class EngineDeadError(SSDError):
    """The engine cannot run another step (a tensor-parallel rank exited); the process should restart."""
