"""Django model permissions derived from roles, so the admin site follows the same rules.

viewer and operator may view every model; admin may do everything. Model permissions
assigned by hand still work through Django's own ModelBackend, listed before this one.
"""

from django.contrib.auth.backends import BaseBackend

from .roles import ADMIN, role_of


class RoleBackend(BaseBackend):
    def has_perm(self, user_obj, perm, obj=None):
        role = role_of(user_obj)
        if role is None:
            return False
        if role == ADMIN:
            return True
        _, _, codename = perm.partition(".")
        return codename.startswith("view_")

    def has_module_perms(self, user_obj, app_label):
        return role_of(user_obj) is not None
