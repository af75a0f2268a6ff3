"""berth: a Python client for berth's orchestrator and sandboxes.

Standard library only. Start with :class:`Client`::

    import berth

    client = berth.Client("http://127.0.0.1:7070", token="...")
    with client.acquire("conv-1", image="berth/base", ttl=600) as lease:
        print(lease.sandbox.exec("echo hello").stdout)
"""

from .client import DEFAULT_URL, Client, Lease
from .errors import (
    Aborted,
    AlreadyExists,
    BerthError,
    Cancelled,
    CommandFailed,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)
from .sandbox import (
    Event,
    ExecResult,
    Exited,
    Gap,
    GitDiff,
    GitFileChange,
    GitStatus,
    Process,
    Sandbox,
    Started,
    Stderr,
    Stdout,
    UploadResult,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL", "Client", "Lease", "Sandbox",
    "ExecResult", "Event", "Started", "Stdout", "Stderr", "Exited", "Gap", "Process", "UploadResult",
    "GitStatus", "GitFileChange", "GitDiff",
    "BerthError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
    "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
    "Internal", "Unavailable", "DataLoss", "Unauthenticated", "CommandFailed",
]
