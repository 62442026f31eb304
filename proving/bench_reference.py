"""The reference the gateway's cost is measured against (`manage.py
bench_gateway`), at `/bench/reference/rows`: a minimal django-ninja POST
inserting one row. Served only by the bench's server (settings
`durable.settings_bench`, URLs `durable.urls_bench`), never by a
deployment's."""

from ninja import NinjaAPI, Schema, Status

from .models import BenchRow

reference = NinjaAPI(title="bench reference", urls_namespace="bench-reference", docs_url=None)


class RowIn(Schema):
    name: str


class RowOut(Schema):
    id: int


@reference.post("/rows", response={201: RowOut})
def row_create(request, row: RowIn):
    return Status(201, {"id": BenchRow.objects.create(name=row.name).pk})


REFERENCE_PATH = "/bench/reference/rows"
