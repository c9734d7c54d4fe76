"""JSON view of the what-if advisor (the REST API may wrap the same function)."""

import json

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.views.decorators.http import require_http_methods

from controlplane.accounts.access import can_anywhere

from .whatif import WhatIfError, WhatIfQuery, whatif


@login_required
@require_http_methods(["GET", "POST"])
def whatif_view(request):
    if not can_anywhere(request.user, "read"):  # hypothetical hardware: any read role will do
        return JsonResponse({"error": "forbidden", "detail": "your role does not allow 'read'"},
                            status=403)
    if request.method == "POST":
        try:
            data = json.loads(request.body or b"{}")
        except ValueError:
            return JsonResponse({"error": "bad_json", "detail": "body is not JSON"}, status=400)
        if not isinstance(data, dict):
            return JsonResponse({"error": "bad_json", "detail": "expected an object"}, status=400)
    else:
        data = request.GET.dict()
    try:
        answer = whatif(WhatIfQuery.from_dict(data))
    except WhatIfError as exc:
        return JsonResponse({"error": "invalid", "fields": exc.errors}, status=400)
    return JsonResponse(answer.as_dict())
