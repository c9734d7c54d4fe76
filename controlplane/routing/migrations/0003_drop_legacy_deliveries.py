"""Drop the old delivery and attempt tables (their rows moved in 0002) and give the
outbox-backed table the old model name."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("routing", "0002_move_deliveries_to_outbox"),
    ]

    operations = [
        migrations.DeleteModel(name="DeliveryAttempt"),
        migrations.DeleteModel(name="GatewayDelivery"),
        migrations.RenameModel(old_name="OutboxGatewayDelivery", new_name="GatewayDelivery"),
        migrations.AlterField(
            model_name="gatewaydelivery",
            name="gateway",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="deliveries", to="topology.gateway"),
        ),
        migrations.AlterField(
            model_name="gatewaydelivery",
            name="table",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="deliveries", to="routing.routingtableversion"),
        ),
    ]
