"""Choice sets for topology fields."""

from django.db import models


class NodeStatus(models.TextChoices):
    UNKNOWN = "unknown", "Unknown (never reported)"
    ONLINE = "online", "Online"
    STALE = "stale", "Stale (missed reports)"
    OFFLINE = "offline", "Offline"
    MAINTENANCE = "maintenance", "Maintenance"


class Transport(models.TextChoices):
    ETHERNET = "ethernet", "Ethernet (TCP)"
    INFINIBAND = "infiniband", "InfiniBand"
    ROCE = "roce", "RoCE"
    EFA = "efa", "AWS EFA"


class EngineKind(models.TextChoices):
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"
    TRTLLM = "trtllm", "TensorRT-LLM"
    SIM = "sim", "Simulated"


class Role(models.TextChoices):
    PREFILL = "prefill", "Prefill"
    DECODE = "decode", "Decode"
    BOTH = "both", "Both (aggregated)"


class WorkerState(models.TextChoices):
    ACTIVE = "active", "Active"
    DRAINING = "draining", "Draining"
    DRAINED = "drained", "Drained (no work)"
    MISSING = "missing", "Missing from agent inventory"
    FAILED = "failed", "Failed"


class GatewayKind(models.TextChoices):
    PDPLANE = "pdplane", "pdplane reference gateway"
    VLLM_ROUTER = "vllm-router", "vllm-router (via adapter)"
    SGLANG_ROUTER = "sglang-router", "sglang-router (via adapter)"
    OTHER = "other", "Other (pulls the table)"
