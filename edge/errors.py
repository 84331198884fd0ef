"""User-facing errors: one line that says what is wrong and how to fix it (scripts print it and exit 2)."""


class BitNestError(Exception):
    """A problem with the user's input (paths, checkpoints, options), never a bug in the runtime."""


class CheckpointError(BitNestError):
    """A checkpoint folder that is missing, incomplete, corrupted or of an unsupported format."""
