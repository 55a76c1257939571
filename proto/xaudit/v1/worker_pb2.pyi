from xaudit.v1 import options_pb2 as _options_pb2
from xaudit.v1 import audit_pb2 as _audit_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FetchJobRequest(_message.Message):
    __slots__ = ("job_id", "worker_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: str
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class JobPayload(_message.Message):
    __slots__ = ("job_id", "claimed", "state", "spec_json", "model_sha256", "model_format", "model_size", "tensors", "attempt", "heartbeat_interval_seconds", "lease_secret")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    MODEL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    claimed: bool
    state: _audit_pb2.JobState
    spec_json: str
    model_sha256: str
    model_format: _audit_pb2.ModelFormat
    model_size: int
    tensors: _containers.RepeatedCompositeFieldContainer[_audit_pb2.Tensor]
    attempt: int
    heartbeat_interval_seconds: float
    lease_secret: str
    def __init__(self, job_id: _Optional[str] = ..., claimed: _Optional[bool] = ..., state: _Optional[_Union[_audit_pb2.JobState, str]] = ..., spec_json: _Optional[str] = ..., model_sha256: _Optional[str] = ..., model_format: _Optional[_Union[_audit_pb2.ModelFormat, str]] = ..., model_size: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[_audit_pb2.Tensor, _Mapping]]] = ..., attempt: _Optional[int] = ..., heartbeat_interval_seconds: _Optional[float] = ..., lease_secret: _Optional[str] = ...) -> None: ...

class FetchBlobRequest(_message.Message):
    __slots__ = ("sha256",)
    SHA256_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    def __init__(self, sha256: _Optional[str] = ...) -> None: ...

class BlobChunk(_message.Message):
    __slots__ = ("data", "total_size")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    total_size: int
    def __init__(self, data: _Optional[bytes] = ..., total_size: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job_id", "worker_id", "progress", "message", "lease_secret")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: str
    progress: float
    message: str
    lease_secret: str
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., progress: _Optional[float] = ..., message: _Optional[str] = ..., lease_secret: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("cancel",)
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    cancel: bool
    def __init__(self, cancel: _Optional[bool] = ...) -> None: ...

class CompleteJobRequest(_message.Message):
    __slots__ = ("job_id", "worker_id", "report", "attributions", "not_applicable", "target_values", "target_classes", "compute_seconds", "lease_secret")
    class NotApplicableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    NOT_APPLICABLE_FIELD_NUMBER: _ClassVar[int]
    TARGET_VALUES_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLASSES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: str
    report: bytes
    attributions: _containers.RepeatedCompositeFieldContainer[_audit_pb2.Tensor]
    not_applicable: _containers.ScalarMap[str, str]
    target_values: _audit_pb2.Tensor
    target_classes: _audit_pb2.Tensor
    compute_seconds: float
    lease_secret: str
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., report: _Optional[bytes] = ..., attributions: _Optional[_Iterable[_Union[_audit_pb2.Tensor, _Mapping]]] = ..., not_applicable: _Optional[_Mapping[str, str]] = ..., target_values: _Optional[_Union[_audit_pb2.Tensor, _Mapping]] = ..., target_classes: _Optional[_Union[_audit_pb2.Tensor, _Mapping]] = ..., compute_seconds: _Optional[float] = ..., lease_secret: _Optional[str] = ...) -> None: ...

class CompleteJobResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class FailJobRequest(_message.Message):
    __slots__ = ("job_id", "worker_id", "code", "message", "lease_secret")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: str
    code: str
    message: str
    lease_secret: str
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., lease_secret: _Optional[str] = ...) -> None: ...

class FailJobResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...
