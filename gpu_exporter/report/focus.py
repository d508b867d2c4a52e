"""``report --format focus``: the report's cost as a FOCUS dataset (the FinOps Open Cost and Usage
Specification, version 1.2), in CSV: one row per GPU, holder, price period and state (``charges``).

What each column holds (docs/cost.md lists them):

- the costs: BilledCost = EffectiveCost = ListCost = ContractedCost, the charge's cost (one price, no
  discount, no commitment), ListUnitPrice = ContractedUnitPrice, the price per hour in the period;
  PricingQuantity = ConsumedQuantity, the GPU-hours, in ``Hours``;
- the periods: ChargePeriodStart/End, the price period; BillingPeriodStart/End, the report's range;
- the charge: ChargeCategory ``Usage``, ChargeFrequency ``Usage-Based``, PricingCategory ``Standard``,
  ChargeClass null (no correction), ServiceCategory ``Compute`` with ServiceSubcategory ``Other
  (Compute)`` (GPU time as infrastructure: the allowed values of 1.2 have no subcategory for
  accelerators), ServiceName ``GPU time``;
- who: ProviderName, PublisherName, InvoiceIssuerName and BillingAccountId ``gpu-exporter`` (the
  report is the source of these charges; there is no invoice), BillingAccountName null;
- the resource: ResourceId, the GPU's uuid on its node (``node/uuid``; its index where it has no
  uuid), ResourceName ``GPU 0 on n1``, ResourceType ``GPU``; Tags, the holder's labels as a JSON
  object (null for the time nobody held it);
- ``x_`` columns for the report's own: the node, GPU index, uuid and model, the state, the holder's
  kind, name and labels, and the price's basis (``period`` or ``average``).

FOCUS allows no null cost, and 0 would be a lie: a GPU without a price has no row (the report's
``totals.unpriced_hours`` says how much time that leaves out; ``--format csv`` has those rows with
empty costs).  Null is an empty field; names that tenants choose are neutralised as in the CSV.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

from .charges import Charge, charges
from .cost import Part
from .csv_export import number, safe

VERSION = "1.2"
SOURCE = "gpu-exporter"
UNIT = "Hours"
# The FOCUS columns that apply, in the specification's (alphabetical) order, then the custom ones.
FOCUS_COLUMNS = ("BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd",
                 "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency",
                 "ChargePeriodEnd", "ChargePeriodStart", "ConsumedQuantity", "ConsumedUnit", "ContractedCost",
                 "ContractedUnitPrice", "EffectiveCost", "InvoiceIssuerName", "ListCost", "ListUnitPrice",
                 "PricingCategory", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "ResourceId",
                 "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "ServiceSubcategory",
                 "Tags")  # fmt: skip
CUSTOM_COLUMNS = ("x_Node", "x_GpuIndex", "x_GpuUuid", "x_GpuModel", "x_GpuState", "x_HolderKind", "x_Holder",
                  "x_Namespace", "x_Pod", "x_HpcJob", "x_Container", "x_User", "x_PriceBasis")  # fmt: skip
COLUMNS = (*FOCUS_COLUMNS, *CUSTOM_COLUMNS)
_NUMERIC = frozenset({"BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
                      "ListCost", "ListUnitPrice", "PricingQuantity"})  # fmt: skip
_STATE_WORDS = {"busy": "busy", "allocated_idle": "allocated but idle",
               "allocated_unknown": "held, activity unknown", "idle": "idle", "down": "down"}  # fmt: skip


def _tags(c: Charge) -> str:
    h = c.holder
    labels = {"namespace": h.namespace, "pod": h.pod, "hpc_job": h.hpc_job, "container": h.container,
              "container_engine": h.engine, "user": h.user}  # fmt: skip
    held = {k: v for k, v in labels.items() if v}
    return json.dumps(held, ensure_ascii=False, sort_keys=True) if held else ""


def _row(c: Charge, billing: tuple[str, str], currency: str) -> dict[str, str]:
    assert c.cost is not None
    cost, price, h = str(c.cost), number(c.price_per_hour), c.holder
    who = h.name or "nobody"
    row = {
        "BilledCost": cost, "BillingAccountId": SOURCE, "BillingAccountName": "", "BillingCurrency": currency,
        "BillingPeriodStart": billing[0], "BillingPeriodEnd": billing[1], "ChargeCategory": "Usage",
        "ChargeClass": "", "ChargeDescription": f"GPU {c.gpu} on {c.node} ({c.model or 'unknown model'}), "
        f"{_STATE_WORDS[c.state]}, {who}", "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": c.period_start, "ChargePeriodEnd": c.period_end,
        "ConsumedQuantity": number(c.hours), "ConsumedUnit": UNIT, "ContractedCost": cost,
        "ContractedUnitPrice": price, "EffectiveCost": cost, "InvoiceIssuerName": SOURCE, "ListCost": cost,
        "ListUnitPrice": price, "PricingCategory": "Standard", "PricingQuantity": number(c.hours),
        "PricingUnit": UNIT, "ProviderName": SOURCE, "PublisherName": SOURCE,
        "ResourceId": f"{c.node}/{c.uuid or c.gpu}", "ResourceName": f"GPU {c.gpu} on {c.node}",
        "ResourceType": "GPU", "ServiceCategory": "Compute", "ServiceName": "GPU time",
        "ServiceSubcategory": "Other (Compute)", "Tags": _tags(c),
        "x_Node": c.node, "x_GpuIndex": c.gpu, "x_GpuUuid": c.uuid, "x_GpuModel": c.model or "",
        "x_GpuState": c.state, "x_HolderKind": h.kind, "x_Holder": h.name, "x_Namespace": h.namespace,
        "x_Pod": h.pod, "x_HpcJob": h.hpc_job, "x_Container": h.container, "x_User": h.user,
        "x_PriceBasis": c.basis or "",
    }  # fmt: skip
    return {k: v if k in _NUMERIC else safe(v) for k, v in row.items()}


def write(rows: Iterable[Charge], billing: tuple[str, str], currency: str | None) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, COLUMNS, lineterminator="\r\n")
    w.writeheader()
    # Only priced charges: FOCUS's costs are never null (1.2, BilledCost: "MUST NOT be null").
    w.writerows(_row(c, billing, currency) for c in rows if c.cost is not None and currency)
    return out.getvalue()


def as_focus(parts: Sequence[Part], doc: dict[str, Any]) -> str:
    return write(charges(parts, doc), (doc["range"]["start"], doc["range"]["end"]), doc["currency"])
