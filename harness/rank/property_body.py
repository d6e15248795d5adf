"""Where one Hypothesis example of a distributed property test runs in a rank.

A ``@given`` test's module attribute is Hypothesis's wrapper, which would draw examples of
its own in every rank. The controller draws them (:mod:`harness.plugin.properties`) and
sends each example's arguments as values of the test's plan; here the rank calls the
function the wrapper holds (``.hypothesis.inner_test``) instead, through the same runner as
any pytest test (:func:`harness.rank.pytest_body.run_pytest_test`): its rank-side fixtures
are set up and torn down around every example.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.protocol.pytest_calls import FixturePlan, TestRef

_INNER = "__harness_inner_{}"
"""The attribute under which a test's undecorated function is found, next to the wrapper."""


def run_example(ref: TestRef, plan: FixturePlan) -> tuple[float, float, float]:
    """Run one example of the ``@given`` test ``ref`` on this rank, as ``run_test`` runs a
    test; the example's drawn arguments are among ``plan``'s values.

    Returns:
        The seconds of the test's setup, call and teardown on this rank.
    """
    from harness.rank import current, pytest_body

    module = current.context().importer.test_module(ref)
    owner: Any = module
    if ref.cls is not None:
        owner = functools.reduce(getattr, ref.cls.split("."), module)
    name = _INNER.format(ref.function)
    if name not in vars(owner):
        # On the class for a method: the rank's instance then binds it like the test.
        setattr(owner, name, getattr(owner, ref.function).hypothesis.inner_test)
    return pytest_body.run_pytest_test(dataclasses.replace(ref, function=name), plan)
