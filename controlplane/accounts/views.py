from datetime import timedelta

from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth import views as auth_views
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from .access import may_issue_scope
from .decorators import role_required
from .forms import TokenCreateForm
from .models import APIToken
from .roles import READ, role_of


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True


def logout_view(request):
    """GET asks for confirmation (a link must not log anyone out); POST logs out."""
    if request.method == "POST":
        logout(request)
        return redirect("accounts:login")
    return render(request, "accounts/logout.html")


@role_required(READ, anywhere=True)
def token_list(request):
    """The user's own tokens; a new token's clear text is shown once, right here."""
    new_token = None
    if request.method == "POST":
        form = TokenCreateForm(request.POST)
        if form.is_valid():
            scope = form.cleaned_data["scope"]
            if not may_issue_scope(request.user, scope):
                form.add_error("scope", f"Role {role_of(request.user)} allows no such token.")
            else:
                days = form.cleaned_data["expires_in_days"]
                _, new_token = APIToken.issue(
                    request.user,
                    scope=scope,
                    description=form.cleaned_data["description"],
                    expires=timezone.now() + timedelta(days=days) if days else None,
                )
                form = TokenCreateForm()
    else:
        form = TokenCreateForm()
    tokens = APIToken.objects.filter(user=request.user)
    return render(
        request,
        "accounts/token_list.html",
        {"form": form, "tokens": tokens, "new_token": new_token, "role": role_of(request.user),
         "memberships": request.user.cluster_memberships.select_related("cluster")},
    )


@require_POST
@role_required(READ, anywhere=True)
def token_revoke(request, pk):
    token = get_object_or_404(APIToken, pk=pk, user=request.user)
    token.revoked = True
    token.save(update_fields=["revoked"])
    messages.info(request, f"Token {token.prefix} revoked.")
    return redirect("accounts:tokens")
