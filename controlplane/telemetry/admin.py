from django.contrib import admin

from .models import AgentCommand, NodeSample, WorkerSample


@admin.register(AgentCommand)
class AgentCommandAdmin(admin.ModelAdmin):
    list_display = ("id", "node", "command", "status", "created", "finished_at")
    list_filter = ("status", "command")
    readonly_fields = ("id", "created", "sent_at", "finished_at")


@admin.register(NodeSample)
class NodeSampleAdmin(admin.ModelAdmin):
    list_display = ("node", "at", "gpu_utilization", "power_w")


@admin.register(WorkerSample)
class WorkerSampleAdmin(admin.ModelAdmin):
    list_display = ("worker", "at", "running", "waiting", "kv_usage", "ttft_p95_s")
