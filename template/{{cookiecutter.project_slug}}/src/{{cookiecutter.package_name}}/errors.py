"""Errors a user can fix; the command line prints them without a traceback."""


class ProjectError(Exception):
    """Base class: the message says what is wrong and how to fix it."""


class ConfigError(ProjectError, ValueError):
    """A configuration value is unknown or out of range."""


class DatasetError(ProjectError):
    """A dataset is missing, too small or unreadable."""


class TokenizerError(ProjectError):
    """Text cannot be encoded, or tokenizer files are missing or wrong."""


class CheckpointError(ProjectError):
    """A checkpoint is missing or corrupt."""


class DeviceError(ProjectError):
    """The requested device or precision is not available here."""
