"""Training on several GPUs with torch.distributed: data parallel with temporal SyncBN
(ddp.py, grad_reduce.py, sync_bn.py) and the temporal pipeline (pipeline.py, planner.py)."""
from .ddp import DataParallel, init_data_parallel, launched
from .grad_reduce import GradientReducer
from .sync_bn import convert_sync_batchnorm
from .pipeline import PipelinePeerError, PipelineTrainer, chunked_step, pipeline_step, split_stages
from .planner import format_plan, plan

__all__ = ["DataParallel", "init_data_parallel", "launched", "GradientReducer", "convert_sync_batchnorm",
           "PipelineTrainer", "PipelinePeerError", "pipeline_step", "chunked_step", "split_stages",
           "plan", "format_plan"]
