# Widens GPU.uuid and GPU.product_name to 128, the agent protocol's limit (issue 20,
# defect 3: longer values passed validation and then failed in the database).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("topology", "0002_agent_metrics_url"),
    ]

    operations = [
        migrations.AlterField(
            model_name="gpu",
            name="product_name",
            field=models.CharField(max_length=128),
        ),
        migrations.AlterField(
            model_name="gpu",
            name="uuid",
            field=models.CharField(help_text="e.g. GPU-5f0c…", max_length=128, unique=True),
        ),
    ]
