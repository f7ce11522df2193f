from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    BFLOAT16: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    BOOL: _ClassVar[DType]

class Operation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_UNSPECIFIED: _ClassVar[Operation]
    PREFILL: _ClassVar[Operation]
    DECODE: _ClassVar[Operation]
    MIXED: _ClassVar[Operation]
    VERIFY: _ClassVar[Operation]
    SCORED_PREFILL: _ClassVar[Operation]

class ValueSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_SOURCE_UNSPECIFIED: _ClassVar[ValueSource]
    INPUT_TOKENS: _ClassVar[ValueSource]
    POSITIONS: _ClassVar[ValueSource]
    BLOCK_TABLES: _ClassVar[ValueSource]
    SLOT_MAPPING: _ClassVar[ValueSource]
    SAMPLING_PARAMETERS: _ClassVar[ValueSource]
    LOGPROB_REQUESTED: _ClassVar[ValueSource]
    LOGPROB_TOKEN_IDS: _ClassVar[ValueSource]
    LOGPROB_TOKEN_ID_COUNTS: _ClassVar[ValueSource]
    PROMPT_TARGET_TOKEN: _ClassVar[ValueSource]
DTYPE_UNSPECIFIED: DType
INT32: DType
INT64: DType
FLOAT32: DType
BFLOAT16: DType
FLOAT16: DType
UINT8: DType
BOOL: DType
OPERATION_UNSPECIFIED: Operation
PREFILL: Operation
DECODE: Operation
MIXED: Operation
VERIFY: Operation
SCORED_PREFILL: Operation
VALUE_SOURCE_UNSPECIFIED: ValueSource
INPUT_TOKENS: ValueSource
POSITIONS: ValueSource
BLOCK_TABLES: ValueSource
SLOT_MAPPING: ValueSource
SAMPLING_PARAMETERS: ValueSource
LOGPROB_REQUESTED: ValueSource
LOGPROB_TOKEN_IDS: ValueSource
LOGPROB_TOKEN_ID_COUNTS: ValueSource
PROMPT_TARGET_TOKEN: ValueSource

class ModelInfo(_message.Message):
    __slots__ = ("architecture", "vocab_size")
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    vocab_size: int
    def __init__(self, architecture: _Optional[str] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class BufferDeclaration(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class InputBinding(_message.Message):
    __slots__ = ("input", "source")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    input: str
    source: ValueSource
    def __init__(self, input: _Optional[str] = ..., source: _Optional[_Union[ValueSource, str]] = ...) -> None: ...

class GraphDeclaration(_message.Message):
    __slots__ = ("name", "operation", "inputs", "outputs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    operation: Operation
    inputs: _containers.RepeatedCompositeFieldContainer[InputBinding]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., operation: _Optional[_Union[Operation, str]] = ..., inputs: _Optional[_Iterable[_Union[InputBinding, _Mapping]]] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class CoreManifest(_message.Message):
    __slots__ = ("format_version", "model", "capacity", "completion_token_capacity", "buffers", "graphs")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKEN_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    model: ModelInfo
    capacity: int
    completion_token_capacity: int
    buffers: _containers.RepeatedCompositeFieldContainer[BufferDeclaration]
    graphs: _containers.RepeatedCompositeFieldContainer[GraphDeclaration]
    def __init__(self, format_version: _Optional[int] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., capacity: _Optional[int] = ..., completion_token_capacity: _Optional[int] = ..., buffers: _Optional[_Iterable[_Union[BufferDeclaration, _Mapping]]] = ..., graphs: _Optional[_Iterable[_Union[GraphDeclaration, _Mapping]]] = ...) -> None: ...
