"""One renderer of privacy statements: the global, federated and local statements carry ``statement`` and ``plain``
rendered from their facts, and the plain words follow the relation (add/remove names taking part at all; replace
says arrivals are public)."""

from __future__ import annotations

import math

from models.accounting.statement import Party, Plain, fmt_delta, fmt_epsilon, render_plain
from models.local.config import LocalConfig
from pipeline.config.settings import Settings
from pipeline.release.statements import flat_facts, hierarchy_facts, rendered


def test_plain_words_follow_the_relation() -> None:
    add_remove = Settings(model="hierarchy", mode="global")
    replace = Settings(model="hierarchy", mode="global", privacy_relation="replace")
    assert add_remove.add_remove and not replace.add_remove
    ar = rendered(flat_facts(add_remove, 1.0, 1e-5, user_level=True))["plain"]
    rp = rendered(flat_facts(replace, 1.0, 1e-5, user_level=True))["plain"]
    assert "whether you took part at all" in ar and "took part" not in rp
    assert "that you came, and when, is public" in rp and "is public" not in ar
    for text in (ar, rp):
        assert f"at most {math.e:.1f}× more likely ((ε, δ) = (1.00, 10⁻⁵))" in text


def test_event_level_covers_one_answer_and_user_level_an_epoch() -> None:
    s = Settings(privacy_relation="replace")
    event = rendered(flat_facts(s, 2.0, 1e-6, user_level=False))
    user = rendered(flat_facts(s, 2.0, 1e-6, user_level=True))
    assert "For any one answer you give" in event["plain"] and "group level k" in event["statement"]
    assert "For everything you do in an epoch" in user["plain"]
    assert user["statement"].startswith(f"per epoch of {s.tree_ticks} release ticks")
    assert f"cap policy: {s.cap_policy}" in user["statement"]


def test_nothing_protected_says_so_without_a_bound() -> None:
    text = rendered(flat_facts(Settings(epsilon=math.inf), math.inf, 1e-5, user_level=False))
    assert "Nothing is protected (ε = ∞)" in text["plain"] and "more likely" not in text["plain"]
    assert "without noise" in text["statement"]


def test_federated_names_the_site_and_the_others() -> None:
    s = Settings(privacy_relation="replace")
    text = rendered(flat_facts(s, 1.0, 1e-5, user_level=False, federated=True))
    assert "stay at your site" in text["plain"]
    assert "against your site: none" in text["statement"]
    assert "against the coordinator and the other sites" in text["statement"]


def test_the_hierarchy_names_its_blocks_and_relation() -> None:
    from pipeline.release.stages import hierarchy_layout
    from pipeline.data.catalog import load_catalog

    s = Settings(model="hierarchy", mode="global")
    layout = hierarchy_layout(s, load_catalog(s))
    st = rendered(hierarchy_facts(s, layout, 1.0, 1e-5))["statement"]
    assert all(b in st for b in layout.blocks) and "under add-remove" in st


def test_a_separate_shuffler_is_not_run_by_the_operator() -> None:
    config = LocalConfig(algorithm="round", d=4, epsilon=1.0, delta=1e-5, shuffle_batch=100)
    separate, worker = config.guarantee(shuffler="separate"), config.guarantee(shuffler="worker")
    assert "runs the shuffler" not in separate["plain"] and "a separate service" in separate["plain"]
    assert "runs the shuffler itself" in worker["plain"]
    assert f"(ε = {fmt_epsilon(config.epsilon0)}, pure)" in separate["plain"]


def test_render_plain_formats_as_the_page_does() -> None:
    assert (fmt_epsilon(123.4), fmt_epsilon(12.34), fmt_epsilon(1.234)) == ("123", "12.3", "1.23")
    assert (fmt_delta(1e-5), fmt_delta(2.5e-7)) == ("10⁻⁵", "2.5·10⁻⁷")
    text = render_plain(Plain(where="W.", covers="C", observer="each report", epsilon=1.0, delta=0.0, total="T."),
                        (Party("P", "G", "if H"),))
    assert text == "W. For C, each report is almost as likely either way: at most 2.7× more likely (ε = 1.00, pure). T. Against P: G, if H."
