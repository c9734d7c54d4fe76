"""Drop the old delivery and attempt tables (their rows moved in 0002) and give the
outbox-backed table the old model name."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("alerts", "0002_move_deliveries_to_outbox"),
    ]

    operations = [
        migrations.DeleteModel(name="DeliveryAttempt"),
        migrations.DeleteModel(name="Delivery"),
        migrations.RenameModel(old_name="OutboxDelivery", new_name="Delivery"),
        migrations.AlterField(
            model_name="delivery",
            name="endpoint",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="deliveries", to="alerts.webhookendpoint"),
        ),
    ]
