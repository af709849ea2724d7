"""Exception types whose messages are meant for users, not for debuggers."""


class ScarcelabError(Exception):
    """Base class: the message names the offending file or parameter and the fix."""


class DataError(ScarcelabError):
    """A data file is missing, corrupt or has the wrong shape/labels."""


class ConfigError(ScarcelabError):
    """A parameter is invalid (unknown name, out of range, inconsistent)."""


class TrialFailed(ScarcelabError):
    """A training trial diverged (NaN/inf loss) or otherwise cannot continue.

    The search records the trial as failed and moves on to the next configuration.
    """
