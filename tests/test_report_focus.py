"""``report --format focus``: the week of tests/test_report_csv.py as a FOCUS dataset, checked against
the FinOps Open Cost and Usage Specification 1.2 (tag v1.2 of FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec,
specification/columns/*.md and specification/attributes/*.md).

PyPI's focus-validator (1.0.0, the only release) is no check of it: it implements a draft of 1.0
(columns named Provider, Publisher, InvoiceIssuer, ResourceID rather than 1.0's ProviderName, ...),
requires every conditional column, pins numpy < 2, and does not import with today's multimethod.  So the
rules below are the specification's, column by column, each with the section it comes from."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from gpu_exporter.report.cost import Part
from gpu_exporter.report.focus import as_focus
from gpu_exporter.report.model import build
from tests.test_report_csv import W, week
from tests.test_report_model import CATALOGUE

# 1.2, the columns whose "Feature level" is Mandatory: present in every FOCUS dataset.
MANDATORY = {"BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd",
             "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargePeriodEnd",
             "ChargePeriodStart", "ContractedCost", "EffectiveCost", "InvoiceIssuerName", "ListCost",
             "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "ServiceCategory",
             "ServiceName"}  # fmt: skip
# 1.2, every column the specification defines (columns.mdpp), so that any other is a custom one.
DEFINED = MANDATORY | {"AvailabilityZone", "BillingAccountType", "CapacityReservationId", "CapacityReservationStatus",
                       "ChargeFrequency", "CommitmentDiscountCategory", "CommitmentDiscountId",
                       "CommitmentDiscountName", "CommitmentDiscountQuantity", "CommitmentDiscountStatus",
                       "CommitmentDiscountType", "CommitmentDiscountUnit", "ConsumedQuantity", "ConsumedUnit",
                       "ContractedUnitPrice", "InvoiceId", "ListUnitPrice", "PricingCategory", "PricingCurrency",
                       "PricingCurrencyContractedUnitPrice", "PricingCurrencyEffectiveCost",
                       "PricingCurrencyListUnitPrice", "RegionId", "RegionName", "ResourceId", "ResourceName",
                       "ResourceType", "ServiceSubcategory", "SkuId", "SkuMeter", "SkuPriceDetails", "SkuPriceId",
                       "SubAccountId", "SubAccountName", "SubAccountType", "Tags"}  # fmt: skip
NOT_NULL = {"BilledCost", "BillingAccountId", "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart",
            "ChargeCategory", "ChargePeriodEnd", "ChargePeriodStart", "ContractedCost", "EffectiveCost",
            "InvoiceIssuerName", "ListCost", "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
            "ChargeFrequency", "ServiceSubcategory"}  # fmt: skip
DECIMALS = {"BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "ListCost",
            "ListUnitPrice", "PricingQuantity"}  # fmt: skip
DATES = {"BillingPeriodEnd", "BillingPeriodStart", "ChargePeriodEnd", "ChargePeriodStart"}
# 1.2 servicecategory.md and servicesubcategory.md: allowed values (the subcategories of Compute and of AI and
# Machine Learning, the two a GPU's time may be).
SERVICE_CATEGORIES = {"AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases",
                      "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things",
                      "Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security",
                      "Storage", "Web", "Other"}  # fmt: skip
SUBCATEGORIES = {"Compute": {"Containers", "End User Computing", "Quantum Compute", "Serverless Compute",
                             "Virtual Machines", "Other (Compute)"},
                 "AI and Machine Learning": {"AI Platforms", "Bots", "Generative AI", "Machine Learning",
                                             "Natural Language Processing",
                                             "Other (AI and Machine Learning)"}}  # fmt: skip
CHARGE_CATEGORIES = {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}  # chargecategory.md
CHARGE_FREQUENCIES = {"One-Time", "Recurring", "Usage-Based"}  # chargefrequency.md
PRICING_CATEGORIES = {"Standard", "Dynamic", "Committed", "Other"}  # pricingcategory.md
# numeric_format.md: an integer, a decimal or E notation, no sign for a positive value, no separators.
NUMERIC = re.compile(r"^-?\d+(\.\d+)?(E-?\d+)?$")
DATE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")  # datetime_format.md: 'YYYY-MM-DDTHH:mm:ssZ', UTC
# currency_format.md: ISO 4217's three letters; the report's currencies come from the pricing settings.
ISO_4217 = {"USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "CNY", "INR", "SEK", "NOK", "DKK", "PLN"}


def dataset() -> tuple[dict[str, Any], list[str], list[dict[str, str]]]:
    r = week()
    doc = build(W, r, CATALOGUE)
    reader = csv.DictReader(io.StringIO(as_focus([Part(W, r)], doc)))
    out = list(reader)
    return doc, list(reader.fieldnames or []), out


def test_the_dataset_has_every_mandatory_column_and_custom_ones_prefixed_after_them() -> None:
    _, columns, _ = dataset()
    assert set(columns) >= MANDATORY, MANDATORY - set(columns)
    custom = [c for c in columns if c not in DEFINED]
    assert custom and all(c.startswith("x_") for c in custom), custom  # column_handling.md: the x_ prefix
    assert columns[-len(custom) :] == custom  # ... after all FOCUS columns, not intermixed
    assert {"x_GpuState", "x_HolderKind"} <= set(custom)


def test_every_row_keeps_the_columns_rules() -> None:
    _, _, out = dataset()
    assert out
    for x in out:
        assert not [c for c in NOT_NULL if x[c] == ""], x  # "MUST NOT be null"
        for c in DECIMALS:
            assert NUMERIC.match(x[c]), (c, x[c])  # Usage rows: "MUST NOT be null" for all of these
        for c in DATES:
            assert DATE.match(x[c]), (c, x[c])
        assert x["ChargeCategory"] in CHARGE_CATEGORIES and x["ChargeCategory"] == "Usage"
        assert x["ChargeClass"] in ("", "Correction")  # chargeclass.md: null unless a correction
        assert x["ChargeFrequency"] in CHARGE_FREQUENCIES and x["PricingCategory"] in PRICING_CATEGORIES
        assert x["ServiceCategory"] in SERVICE_CATEGORIES
        assert x["ServiceSubcategory"] in SUBCATEGORIES.get(x["ServiceCategory"], set())
        assert x["BillingCurrency"] in ISO_4217
        start, end = (datetime.fromisoformat(x[c].replace("Z", "+00:00")) for c in ("ChargePeriodStart",
                                                                                    "ChargePeriodEnd"))  # fmt: skip
        bill = [datetime.fromisoformat(x[c].replace("Z", "+00:00")) for c in ("BillingPeriodStart", "BillingPeriodEnd")]
        assert bill[0] <= start < end <= bill[1]  # chargeperiodstart.md: inclusive start, exclusive end
        # consumedunit.md, pricingunit.md: a unit exactly where there is a quantity
        assert bool(x["ConsumedUnit"]) == bool(x["ConsumedQuantity"]) and bool(x["PricingUnit"]) == bool(
            x["PricingQuantity"]
        )
        # listunitprice.md, contractedunitprice.md: unit price x PricingQuantity matches the cost (here to the
        # report's fourth digit, to which costs are rounded)
        for price, cost in (("ListUnitPrice", "ListCost"), ("ContractedUnitPrice", "ContractedCost")):
            assert abs(Decimal(x[price]) * Decimal(x["PricingQuantity"]) - Decimal(x[cost])) < Decimal("0.0002"), x
        assert Decimal(x["ListUnitPrice"]) >= 0
        if x["Tags"]:  # key_value_format.md: a JSON object
            assert isinstance(json.loads(x["Tags"]), dict)


def test_the_billed_cost_adds_up_to_the_reports_total_and_unpriced_gpus_have_no_rows() -> None:
    doc, _, out = dataset()
    try:
        billed = sum(Decimal(x["BilledCost"]) for x in out)
    except InvalidOperation as e:  # pragma: no cover - a cost that is no number fails the rule above too
        raise AssertionError(out) from e
    assert billed == Decimal(str(doc["totals"]["cost"]))
    assert {x["x_GpuUuid"] for x in out} == {g["uuid"] for g in doc["gpus"] if g["cost"] is not None}
    shared = {json.loads(x["Tags"] or "null") and json.loads(x["Tags"])["pod"] for x in out
              if x["x_GpuUuid"] == "GPU-shared"}  # fmt: skip
    assert shared == {"train-a", "serve-b", None}  # two pods and the time nobody held it (Tags null)
    assert {x["ResourceId"] for x in out if x["x_GpuUuid"] == "GPU-shared"} == {"n1/GPU-shared"}
