"""Create viewer / operator / admin demo users (password = username unless given)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from controlplane.accounts.access import set_role
from controlplane.accounts.roles import ROLES


class Command(BaseCommand):
    help = "Create one demo user per role: viewer, operator, admin."

    def add_arguments(self, parser):
        parser.add_argument("--password", help="Password for all three (default: the username)")

    def handle(self, *args, password=None, **options):
        User = get_user_model()
        for role in ROLES:
            user, created = User.objects.get_or_create(username=role)
            user.set_password(password or role)
            # is_staff lets every role into the admin site; what each may do there follows
            # the role (controlplane.accounts.backends.RoleBackend).
            user.is_staff = True
            user.save()
            set_role(user, role)
            self.stdout.write(f"{'created' if created else 'updated'} {role}")
