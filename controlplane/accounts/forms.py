from django import forms

from .models import TokenScope


class TokenCreateForm(forms.Form):
    description = forms.CharField(max_length=200, required=False)
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ)
    expires_in_days = forms.IntegerField(
        min_value=1, max_value=3650, required=False, help_text="Empty: never expires"
    )
