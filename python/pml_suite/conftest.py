"""Swaps wgpu_metric_learning's drop-ins into pytorch-metric-learning before PML's own tests
import it (copied next to this file by ``run.py``): the miners, CrossBatchMemory, the losses
the library computes and the accuracy calculator's default kNN. Each test then runs against
the drop-in wherever it names PML's class.

Tests that fail for PML itself are marked ``xfail`` (not strict) with the reason, in
``KNOWN``; nothing else is skipped."""

import os

import pytest
import pytorch_metric_learning.losses as pml_losses
import pytorch_metric_learning.miners as pml_miners
from pytorch_metric_learning.utils import accuracy_calculator

import wgpu_metric_learning as wml
from wgpu_metric_learning import pml as drop

# The drop-ins' shared context (backend "auto"): the path run.py was asked for.
BACKEND = os.environ.get("WML_PML_SUITE_BACKEND", "cpu")
wml._default = wml.Context(backend=BACKEND)

MINERS = [
    "AngularMiner",
    "BatchEasyHardMiner",
    "BatchHardMiner",
    "DistanceWeightedMiner",
    "HDCMiner",
    "MultiSimilarityMiner",
    "PairMarginMiner",
    "TripletMarginMiner",
    "UniformHistogramMiner",
]
LOSSES = [
    "AngularLoss",
    "ArcFaceLoss",
    "CosFaceLoss",
    "LargeMarginSoftmaxLoss",
    "NormalizedSoftmaxLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "SoftTripleLoss",
    "SphereFaceLoss",
    "SubCenterArcFaceLoss",
    "CircleLoss",
    "ContrastiveLoss",
    "CrossBatchMemory",
    "DynamicSoftMarginLoss",
    "FastAPLoss",
    "GeneralizedLiftedStructureLoss",
    "HistogramLoss",
    "InstanceLoss",
    "IntraPairVarianceLoss",
    "LiftedStructureLoss",
    "MarginLoss",
    "MultiSimilarityLoss",
    "NCALoss",
    "NPairsLoss",
    "NTXentLoss",
    "PNPLoss",
    "RankedListLoss",
    "SignalToNoiseRatioContrastiveLoss",
    "SupConLoss",
    "ThresholdConsistentMarginLoss",
    "TripletMarginLoss",
    "TupletMarginLoss",
    "VICRegLoss",
]

for name in MINERS:
    setattr(pml_miners, name, getattr(drop, name))
for name in LOSSES:
    setattr(pml_losses, name, getattr(drop, name))
# AccuracyCalculator(knn_func=None) makes its kNN with FaissKNN(): ours instead (squared L2
# on the raw rows, as Faiss's IndexFlatL2).
accuracy_calculator.FaissKNN = drop.KNN

# Test id (file::class::test) → why it may fail: PML's own baseline here.
KNOWN = {
    "tests/losses/test_cross_batch_memory.py::TestCrossBatchMemory::test_loss": (
        "fails for PML 2.9.0 itself on this machine (see ../shared/anchors/pml-tests/README.md)"
    ),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = KNOWN.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))


def pytest_report_header(config):
    swapped = ", ".join(MINERS + LOSSES + ["AccuracyCalculator's default kNN"])
    return [
        f"wgpu_metric_learning drop-ins swapped in: {swapped}",
        f"on {wml.default_context()!r}",
    ]
