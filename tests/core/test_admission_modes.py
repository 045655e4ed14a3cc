"""Admission baselines selected by ``AdmissionConfig.mode``: FCFS admits everything,
priority-only shedding refuses sheddable calls on llm-d's scraped saturation alone."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferplane.core.admission import Admission, Admit, Enqueue, Reject
from inferplane.core.admission_config import AdmissionConfig, AdmissionMode, QuotaLimits
from inferplane.core.capacity import scraped_saturation
from inferplane.core.types import PriorityClass
from tests.core.routing_helpers import view
from tests.core.test_admission import CRIT, SHED, STD, StubPredictor, call

FULL = [view("a", waiting=20, running=4, in_flight=24), view("b", waiting=10, running=4)]


def test_mode_parses_from_config_and_rejects_unknown_names() -> None:
    assert AdmissionConfig.model_validate({"mode": "fcfs"}).mode is AdmissionMode.FCFS
    assert AdmissionConfig().mode is AdmissionMode.INFERPLANE
    with pytest.raises(ValidationError):
        AdmissionConfig.model_validate({"mode": "lifo"})


@pytest.mark.parametrize("prio", [CRIT, STD, SHED])
def test_fcfs_admits_every_class_on_a_saturated_pool(prio: PriorityClass) -> None:
    adm = Admission(AdmissionConfig(mode=AdmissionMode.FCFS), StubPredictor(wait_s=50.0))
    c = call(f"r-{prio.value}", prio=prio, ttft_budget_s=1.0, deadline_s=2.0)
    d = adm.admit(c, FULL, 0.0)
    assert isinstance(d, Admit)  # the same call under the full rule would not be admitted
    full = Admission(AdmissionConfig(), StubPredictor(wait_s=50.0)).admit(c, FULL, 0.0)
    assert isinstance(full, Enqueue | Reject)
    assert len(adm.queue) == 0
    assert adm.snapshot().admitted[prio.value] == 1


def test_fcfs_still_applies_quotas() -> None:
    cfg = AdmissionConfig.model_validate(
        {"mode": "fcfs", "quotas": {"tenants": {"t": {"requests_per_min": 1}}}}
    )
    assert cfg.quotas.tenants["t"] == QuotaLimits(requests_per_min=1)
    adm = Admission(cfg, StubPredictor())
    assert isinstance(adm.admit(call("a"), FULL, 0.0), Admit)
    second = adm.admit(call("b"), FULL, 0.0)
    assert isinstance(second, Reject)
    assert second.retry_after_s >= 1


def test_priority_shed_refuses_only_sheddable_at_saturation() -> None:
    adm = Admission(AdmissionConfig(mode=AdmissionMode.PRIORITY_SHED), StubPredictor())
    sat = scraped_saturation(FULL, 5.0, 0.8)
    assert sat == pytest.approx((20 / 5 + 10 / 5) / 2)
    shed = adm.admit(call("s", prio=SHED), FULL, 0.0)
    assert isinstance(shed, Reject)
    assert (shed.status, shed.code, shed.retry_after_s) == (429, "saturated", 0)
    assert isinstance(adm.admit(call("d", prio=STD), FULL, 0.0), Admit)
    assert isinstance(adm.admit(call("c", prio=CRIT), FULL, 0.0), Admit)
    assert adm.snapshot().rejected == {"sheddable": {"saturated": 1}}


def test_priority_shed_uses_scraped_load_not_gateway_in_flight() -> None:
    """llm-d sees what the engines report: in-flight counts alone do not saturate the pool."""
    adm = Admission(AdmissionConfig(mode=AdmissionMode.PRIORITY_SHED), StubPredictor())
    busy = [view("a", in_flight=500), view("b", in_flight=500)]
    assert isinstance(adm.admit(call("s", prio=SHED), busy, 0.0), Admit)
    kv_full = [view("a", kv=0.8), view("b", kv=0.9)]
    assert isinstance(adm.admit(call("t", prio=SHED), kv_full, 0.0), Reject)


def test_scraped_saturation_of_an_empty_pool_is_zero() -> None:
    assert scraped_saturation([], 5.0, 0.8) == 0.0
