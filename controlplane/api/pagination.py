from rest_framework import pagination


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    """NetBox-style ``?limit=&offset=``; ``limit`` is capped so one request stays cheap."""

    default_limit = 50
    max_limit = 1000

    # PostgreSQL's OFFSET is a bigint: an absurd offset must be an empty page, not a 500.
    max_offset = 10**12

    def get_offset(self, request):
        return min(super().get_offset(request), self.max_offset)
