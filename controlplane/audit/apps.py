from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "controlplane.audit"
    label = "audit"
    verbose_name = "Audit log"

    def ready(self):
        from . import signals

        signals.connect()
        _celery_actor_hooks()


def _celery_actor_hooks():
    """Every Celery task runs as system actor ``celery:<task name>`` unless the task sets
    its own (``with audit.actor("planner")``)."""
    try:
        from celery.signals import task_postrun, task_prerun
    except ImportError:  # pragma: no cover - celery is a dependency
        return
    from . import context

    bound = {}

    def _prerun(task_id=None, task=None, **kwargs):
        cm = context.actor(f"celery:{getattr(task, 'name', 'task')}", request_id=task_id)
        cm.__enter__()
        bound[task_id] = cm

    def _postrun(task_id=None, **kwargs):
        cm = bound.pop(task_id, None)
        if cm is not None:
            cm.__exit__(None, None, None)

    task_prerun.connect(_prerun, weak=False, dispatch_uid="audit_celery_prerun")
    task_postrun.connect(_postrun, weak=False, dispatch_uid="audit_celery_postrun")
