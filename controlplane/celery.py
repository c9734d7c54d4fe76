import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("pdplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from controlplane.observability.metrics import install_celery_hooks  # noqa: E402

install_celery_hooks()
