from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "controlplane.accounts"
    label = "accounts"
    verbose_name = "Accounts"

    def ready(self):
        from controlplane.audit.registry import register

        register("accounts.ClusterMembership")  # who was given which cluster, in the log
