from django import forms
from django.contrib import admin

from .models import GPU, NIC, Cluster, Fabric, Gateway, Node, ServedModel, Worker
from .models.serving import check_worker_gpus


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ["index", "uuid", "product_name", "memory_bytes", "nvlink_group", "missing"]


class NICInline(admin.TabularInline):
    model = NIC
    extra = 0
    fields = ["name", "line_rate_gbps", "transport", "rdma", "fabric", "missing"]


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "created"]
    search_fields = ["name"]


@admin.register(Fabric)
class FabricAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "transport", "rdma", "line_rate_gbps"]
    list_filter = ["cluster", "transport", "rdma"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "cluster", "rack", "zone", "status", "last_seen"]
    list_filter = ["cluster", "status", "rack"]
    search_fields = ["hostname"]
    inlines = [GPUInline, NICInline]


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ["__str__", "product_name", "memory_bytes", "nvlink_group", "uuid", "missing"]
    list_filter = ["node__cluster", "product_name", "missing"]
    search_fields = ["uuid", "node__hostname"]


@admin.register(NIC)
class NICAdmin(admin.ModelAdmin):
    list_display = ["__str__", "line_rate_gbps", "transport", "rdma", "fabric"]
    list_filter = ["transport", "rdma", "fabric"]


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "layers", "kv_heads", "head_dim", "kv_dtype_bytes",
                    "kv_bytes_per_token", "kv_block_size"]
    list_filter = ["cluster"]


class WorkerAdminForm(forms.ModelForm):
    class Meta:
        model = Worker
        fields = [
            "served_model", "node", "name", "gpus", "tp_size", "engine_kind", "api_url",
            "metrics_url", "kv_events_endpoint", "kv_replay_endpoint", "desired_role",
            "observed_role", "state", "generation", "observed_generation",
        ]

    def clean(self):
        cleaned = super().clean()
        gpus = cleaned.get("gpus")
        if gpus is not None and not self.errors:
            worker = self.instance
            for field in ("served_model", "node", "tp_size"):
                if field in cleaned:
                    setattr(worker, field, cleaned[field])
            check_worker_gpus(worker, list(gpus))
        return cleaned


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    form = WorkerAdminForm
    list_display = ["__str__", "served_model", "desired_role", "observed_role", "state",
                    "tp_size", "engine_kind", "generation", "observed_generation"]
    list_filter = ["served_model__cluster", "served_model", "desired_role", "state"]
    filter_horizontal = ["gpus"]


@admin.register(Gateway)
class GatewayAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "kind", "url", "applied_table_version", "last_ack_at"]
    list_filter = ["cluster", "kind"]
