"""Capture create/update/delete of audited models through Django's model signals.

Receivers are connected for every sender and filter with the registry, so models added by
other apps are covered by listing their label (controlplane/audit/registry.py). Records are
written in the same transaction as the change: a rolled-back change leaves no record.
Bulk operations (``QuerySet.update``, ``bulk_create``) send no signals and are not recorded
here; code doing bulk changes that matter calls :func:`controlplane.audit.log_action`.
"""

from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from .context import current_request_id
from .models import ChangeAction, ChangeRecord
from .recording import record_change, snapshot
from .registry import is_audited

_BEFORE = "_audit_before"


def _before_save(sender, instance, raw=False, **kwargs):
    if raw or not is_audited(sender) or instance._state.adding or instance.pk is None:
        return
    current = sender._base_manager.filter(pk=instance.pk).first()
    setattr(instance, _BEFORE, snapshot(current) if current is not None else None)


def _after_save(sender, instance, created, raw=False, **kwargs):
    if raw or not is_audited(sender):
        return
    before = None if created else getattr(instance, _BEFORE, None)
    action = ChangeAction.CREATE if created or before is None else ChangeAction.UPDATE
    record_change(instance, action, before=before, after=snapshot(instance))
    if hasattr(instance, _BEFORE):
        delattr(instance, _BEFORE)


def _after_delete(sender, instance, **kwargs):
    if not is_audited(sender):
        return
    record_change(instance, ChangeAction.DELETE, before=snapshot(instance), after=None)


def _m2m_changed(sender, instance, action, reverse, model, pk_set, **kwargs):
    """Many-to-many edits (a worker's GPUs) are recorded as updates of the owning object."""
    if reverse or not is_audited(type(instance)):
        return
    field = next(
        (f for f in instance._meta.many_to_many if f.remote_field.through is sender), None
    )
    if field is None:
        return
    key = f"_audit_m2m_{field.name}"
    if action.startswith("pre_"):
        setattr(instance, key, sorted(getattr(instance, field.name).values_list("pk", flat=True)))
        return
    before_ids = getattr(instance, key, None)
    after_ids = sorted(getattr(instance, field.name).values_list("pk", flat=True))
    if before_ids is None or before_ids == after_ids:
        return
    delattr(instance, key)
    # .set() is a remove then an add: fold the steps of one request into one record.
    request_id = current_request_id()
    previous = (
        ChangeRecord.objects.filter(
            object_type=instance._meta.label_lower,
            object_id=str(instance.pk),
            action=ChangeAction.UPDATE,
            request_id=request_id or "",
        ).order_by("-id").first()
        if request_id
        else None
    )
    if previous is not None and set(previous.after or {}) == {field.name}:
        previous.after = {field.name: after_ids}
        previous.save(update_fields=["after"])
        return
    record_change(
        instance,
        ChangeAction.UPDATE,
        before={field.name: before_ids},
        after={field.name: after_ids},
    )


def connect():
    pre_save.connect(_before_save, dispatch_uid="audit_pre_save")
    post_save.connect(_after_save, dispatch_uid="audit_post_save")
    post_delete.connect(_after_delete, dispatch_uid="audit_post_delete")
    m2m_changed.connect(_m2m_changed, dispatch_uid="audit_m2m_changed")
