import datetime

from xaudit.v1 import options_pb2 as _options_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_FORMAT_UNSPECIFIED: _ClassVar[ModelFormat]
    MODEL_FORMAT_ONNX: _ClassVar[ModelFormat]
    MODEL_FORMAT_TORCHSCRIPT: _ClassVar[ModelFormat]

class JobKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_KIND_UNSPECIFIED: _ClassVar[JobKind]
    JOB_KIND_AUDIT: _ClassVar[JobKind]
    JOB_KIND_ATTRIBUTION: _ClassVar[JobKind]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
MODEL_FORMAT_UNSPECIFIED: ModelFormat
MODEL_FORMAT_ONNX: ModelFormat
MODEL_FORMAT_TORCHSCRIPT: ModelFormat
JOB_KIND_UNSPECIFIED: JobKind
JOB_KIND_AUDIT: JobKind
JOB_KIND_ATTRIBUTION: JobKind
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState

class ModelMetadata(_message.Message):
    __slots__ = ("format", "declared_size", "name")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DECLARED_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    format: ModelFormat
    declared_size: int
    name: str
    def __init__(self, format: _Optional[_Union[ModelFormat, str]] = ..., declared_size: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("metadata", "data")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    metadata: ModelMetadata
    data: bytes
    def __init__(self, metadata: _Optional[_Union[ModelMetadata, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ModelRef(_message.Message):
    __slots__ = ("sha256", "format", "size", "name")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    format: ModelFormat
    size: int
    name: str
    def __init__(self, sha256: _Optional[str] = ..., format: _Optional[_Union[ModelFormat, str]] = ..., size: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "datatype", "shape", "raw_contents")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    RAW_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    datatype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    raw_contents: bytes
    def __init__(self, name: _Optional[str] = ..., datatype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., raw_contents: _Optional[bytes] = ...) -> None: ...

class MethodSpec(_message.Message):
    __slots__ = ("name", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("model_sha256", "inputs", "players", "baseline", "target", "methods", "audit_order", "tolerances", "seed", "device", "attachments", "group_names", "idempotency_key", "explain", "embedding_tensor", "budget_evaluations", "budget_seconds", "confidence")
    class TolerancesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    PLAYERS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ORDER_FIELD_NUMBER: _ClassVar[int]
    TOLERANCES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAMES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_TENSOR_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    model_sha256: str
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    players: str
    baseline: str
    target: str
    methods: _containers.RepeatedCompositeFieldContainer[MethodSpec]
    audit_order: int
    tolerances: _containers.ScalarMap[str, float]
    seed: int
    device: str
    attachments: _containers.RepeatedCompositeFieldContainer[Tensor]
    group_names: _containers.RepeatedScalarFieldContainer[str]
    idempotency_key: str
    explain: str
    embedding_tensor: str
    budget_evaluations: int
    budget_seconds: float
    confidence: float
    def __init__(self, model_sha256: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., players: _Optional[str] = ..., baseline: _Optional[str] = ..., target: _Optional[str] = ..., methods: _Optional[_Iterable[_Union[MethodSpec, _Mapping]]] = ..., audit_order: _Optional[int] = ..., tolerances: _Optional[_Mapping[str, float]] = ..., seed: _Optional[int] = ..., device: _Optional[str] = ..., attachments: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., group_names: _Optional[_Iterable[str]] = ..., idempotency_key: _Optional[str] = ..., explain: _Optional[str] = ..., embedding_tensor: _Optional[str] = ..., budget_evaluations: _Optional[int] = ..., budget_seconds: _Optional[float] = ..., confidence: _Optional[float] = ...) -> None: ...

class PlanStratum(_message.Message):
    __slots__ = ("order", "sets", "audited", "exhaustive")
    ORDER_FIELD_NUMBER: _ClassVar[int]
    SETS_FIELD_NUMBER: _ClassVar[int]
    AUDITED_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTIVE_FIELD_NUMBER: _ClassVar[int]
    order: int
    sets: int
    audited: int
    exhaustive: bool
    def __init__(self, order: _Optional[int] = ..., sets: _Optional[int] = ..., audited: _Optional[int] = ..., exhaustive: _Optional[bool] = ...) -> None: ...

class PlanMethod(_message.Message):
    __slots__ = ("name", "forward_passes", "backward_passes", "from_game")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    FROM_GAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    forward_passes: float
    backward_passes: float
    from_game: bool
    def __init__(self, name: _Optional[str] = ..., forward_passes: _Optional[float] = ..., backward_passes: _Optional[float] = ..., from_game: _Optional[bool] = ...) -> None: ...

class AuditPlan(_message.Message):
    __slots__ = ("players", "samples", "sub_inputs_per_sample", "sub_inputs", "strata", "seed", "game_forward_passes", "methods", "evaluations", "sized_by_worker")
    PLAYERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SUB_INPUTS_PER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SUB_INPUTS_FIELD_NUMBER: _ClassVar[int]
    STRATA_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GAME_FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    SIZED_BY_WORKER_FIELD_NUMBER: _ClassVar[int]
    players: int
    samples: int
    sub_inputs_per_sample: int
    sub_inputs: int
    strata: _containers.RepeatedCompositeFieldContainer[PlanStratum]
    seed: int
    game_forward_passes: float
    methods: _containers.RepeatedCompositeFieldContainer[PlanMethod]
    evaluations: float
    sized_by_worker: bool
    def __init__(self, players: _Optional[int] = ..., samples: _Optional[int] = ..., sub_inputs_per_sample: _Optional[int] = ..., sub_inputs: _Optional[int] = ..., strata: _Optional[_Iterable[_Union[PlanStratum, _Mapping]]] = ..., seed: _Optional[int] = ..., game_forward_passes: _Optional[float] = ..., methods: _Optional[_Iterable[_Union[PlanMethod, _Mapping]]] = ..., evaluations: _Optional[float] = ..., sized_by_worker: _Optional[bool] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "kind", "state", "progress", "message", "error_code", "error_message", "created_at", "started_at", "finished_at", "model_sha256", "report_available", "idempotency_key", "attempts", "compute_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    REPORT_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: JobKind
    state: JobState
    progress: float
    message: str
    error_code: str
    error_message: str
    created_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    model_sha256: str
    report_available: bool
    idempotency_key: str
    attempts: int
    compute_seconds: float
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[JobKind, str]] = ..., state: _Optional[_Union[JobState, str]] = ..., progress: _Optional[float] = ..., message: _Optional[str] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., model_sha256: _Optional[str] = ..., report_available: _Optional[bool] = ..., idempotency_key: _Optional[str] = ..., attempts: _Optional[int] = ..., compute_seconds: _Optional[float] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetReportRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("report", "content_type")
    REPORT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    report: bytes
    content_type: str
    def __init__(self, report: _Optional[bytes] = ..., content_type: _Optional[str] = ...) -> None: ...

class GetAttributionsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class Attributions(_message.Message):
    __slots__ = ("attributions", "not_applicable", "target_values", "target_classes")
    class NotApplicableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    NOT_APPLICABLE_FIELD_NUMBER: _ClassVar[int]
    TARGET_VALUES_FIELD_NUMBER: _ClassVar[int]
    TARGET_CLASSES_FIELD_NUMBER: _ClassVar[int]
    attributions: _containers.RepeatedCompositeFieldContainer[Tensor]
    not_applicable: _containers.ScalarMap[str, str]
    target_values: Tensor
    target_classes: Tensor
    def __init__(self, attributions: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., not_applicable: _Optional[_Mapping[str, str]] = ..., target_values: _Optional[_Union[Tensor, _Mapping]] = ..., target_classes: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class GetSigningKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SigningKey(_message.Message):
    __slots__ = ("key_id", "public_key_pem")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_PEM_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    public_key_pem: str
    def __init__(self, key_id: _Optional[str] = ..., public_key_pem: _Optional[str] = ...) -> None: ...

class SigningKeys(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[SigningKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[SigningKey, _Mapping]]] = ...) -> None: ...
