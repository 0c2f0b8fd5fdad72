"""The job specification: what to reconstruct, from which dataset, on how many ranks.

A :class:`JobSpec` is plain JSON (pydantic), so the CLI, the napari plugin
and the HTTP API share it.  Validation errors name the field: pydantic's
``loc`` for structural problems, and the parameter name (from
:data:`ctbench.workbench.workflow.ALGORITHMS`) for bad algorithm parameters.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..workbench.workflow import ReconRequest

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")


class RequestSpec(BaseModel):
    """A :class:`~ctbench.workbench.workflow.ReconRequest` as JSON: algorithm, parameters, mode."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str = Field(description="fbp, sirt, cgls or tv (ctbench.workbench.workflow.ALGORITHMS)")
    params: dict = Field(default_factory=dict, description="algorithm parameters, e.g. {\"n_iter\": 10}")
    mode: Literal["full"] = Field("full", description="jobs reconstruct the full problem (previews run locally)")

    @model_validator(mode="after")
    def _valid_request(self):
        # Defaults filled in and values coerced by the workbench's own rules, so
        # a job and a local run accept exactly the same requests.
        r = ReconRequest(self.algorithm, dict(self.params), self.mode).validated()
        self.params = r.params
        return self

    def to_request(self) -> ReconRequest:
        return ReconRequest(self.algorithm, dict(self.params), self.mode)

    @classmethod
    def from_request(cls, request: ReconRequest) -> "RequestSpec":
        return cls(**request.to_dict())


class JobSpec(BaseModel):
    """Everything a bridge needs to run one reconstruction as a torchrun job."""

    model_config = ConfigDict(extra="forbid")

    request: RequestSpec
    dataset: str = Field(min_length=1, description="ctbench zarr dataset with a sinogram and geometry: an absolute "
                                                  "path on the bridge host, or a path relative to its data directory")
    output: str | None = Field(None, description="where the result dataset goes (relative: under the data directory);"
                                                 " default: result.zarr in the job's directory")
    name: str | None = Field(None, max_length=200, description="a label for listings")
    nproc: int = Field(1, ge=1, le=256, description="ranks (processes) on this host")
    devices: list[str] | None = Field(None, description="GPU per rank, e.g. [\"cuda:0\", \"cuda:1\"] "
                                                        "(default: cuda:LOCAL_RANK when CUDA is present, else CPU)")
    partition: Literal["views", "space", "hybrid"] = "views"
    partition_grid: tuple[int, int] | None = Field(None, description="(view_ranks, space_ranks), hybrid only")
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="process-group backend; auto: nccl on "
                                                                        "GPUs, gloo on CPUs")
    memory_budget: int | str | None = Field(None, description="bytes (or e.g. \"2 GiB\") one projector window "
                                                               "may hold, per rank")
    threads_per_rank: int | None = Field(None, ge=1, le=1024, description="OMP_NUM_THREADS of each rank")
    checkpoint_every: int = Field(0, ge=0, description="write a checkpoint every this many iterations "
                                                       "(0: never); a checkpointed job resumes after a bridge restart")
    preview_interval: float = Field(1.0, ge=0.05, le=3600, description="seconds between live previews at least")
    preview_size: int = Field(64, ge=8, le=1024, description="largest side of the downsampled preview slice")

    @field_validator("devices")
    @classmethod
    def _devices(cls, v):
        if v is not None:
            for d in v:
                if not (d == "cpu" or d.startswith("cuda:") and d[5:].isdigit()):
                    raise ValueError(f"devices entries must be 'cpu' or 'cuda:N', got {d!r}")
        return v

    @field_validator("memory_budget")
    @classmethod
    def _budget(cls, v):
        if v is not None:
            from ..engine.plan import parse_bytes
            parse_bytes(v, "memory_budget")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.partition == "hybrid":
            if self.partition_grid is None:
                raise ValueError("partition_grid (view_ranks, space_ranks) is required for partition='hybrid'")
            a, b = self.partition_grid
            if a < 1 or b < 1 or a * b != self.nproc:
                raise ValueError(f"partition_grid {self.partition_grid} must be two positive integers whose "
                                 f"product is nproc={self.nproc}")
        elif self.partition_grid is not None:
            raise ValueError("partition_grid is only used with partition='hybrid'")
        if self.devices is not None and len(self.devices) != self.nproc:
            raise ValueError(f"devices must list one device per rank: {self.nproc} entries, got {len(self.devices)}")
        if self.checkpoint_every and self.request.algorithm != "cgls":
            raise ValueError("checkpoint_every is supported for algorithm 'cgls' only (disk-backed CGLS)")
        if self.checkpoint_every and self.partition == "hybrid":
            raise ValueError("checkpoint_every needs partition 'views' or 'space' (disk-backed CGLS)")
        return self
