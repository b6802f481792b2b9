"""gemmbn.version_cache.VersionCache, the mechanism behind weight_cache (the split weight) and eval_fold_cache (the
eval fold), on CPU tensors: a value is made once and kept while none of its tensors changed, and made again after each
kind of change the caches promise to see. The GPU tests check both caches' values against their uncached operators."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from gemmbn.version_cache import VersionCache


@pytest.fixture(autouse=True)
def _not_capturing(monkeypatch):
    # A CPU build of torch cannot answer the CUDA capture query; nothing is being captured here.
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


class _Maker:
    """make() for the cache, counting its calls; each value is a new object."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return object()


def test_a_value_is_kept_until_a_tensor_or_the_extra_facts_change():
    key, other = torch.randn(4), torch.randn(4)
    cache, make = VersionCache(), _Maker()
    first = cache.get(key, (key, None, other), "extra", make)
    assert cache.get(key, (key, None, other), "extra", make) is first and make.calls == 1
    other.add_(1.0)  # in place: the version counter moves
    second = cache.get(key, (key, None, other), "extra", make)
    assert second is not first and make.calls == 2
    assert cache.get(key, (key, None, other), "other extra", make) is not second and make.calls == 3
    replacement = other.clone()  # another tensor in the same place
    assert cache.get(key, (key, None, replacement), "other extra", make) is not None and make.calls == 4
    key.set_(torch.randn(4).untyped_storage())  # new storage under the key
    cache.get(key, (key, None, replacement), "other extra", make)
    assert make.calls == 5
    cache.clear()
    cache.get(key, (key, None, replacement), "other extra", make)
    assert make.calls == 6


def test_nothing_is_cached_for_inference_tensors_or_while_tracing(monkeypatch):
    cache, make = VersionCache(), _Maker()
    with torch.inference_mode():
        key = torch.randn(4)
    assert cache.get(key, (key,), None, make) is None and make.calls == 0
    key = torch.randn(4)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert cache.get(key, (key,), None, make) is None and make.calls == 0


def test_an_entry_goes_with_its_key_tensor():
    cache, make = VersionCache(), _Maker()
    key, other = torch.randn(4), torch.randn(4)
    cache.get(key, (other, key), None, make)
    assert len(cache._entries) == 1
    del key
    gc.collect()
    assert not cache._entries


def test_an_entry_goes_with_any_of_its_tensors_and_a_hit_needs_the_same_tensors():
    cache, make = VersionCache(), _Maker()
    key, other = torch.randn(4), torch.randn(4)
    first = cache.get(key, (key, other), None, make)
    # Another tensor object over the same storage with the same version counter (a view): not the tensor the value
    # was made from, so no hit.
    alias = other.view(4)
    assert alias.data_ptr() == other.data_ptr() and alias._version == other._version
    assert cache.get(key, (key, alias), None, make) is not first and make.calls == 2
    del other  # the first entry's tensor: gone with the entry already replaced, nothing to evict
    gc.collect()
    assert len(cache._entries) == 1
    del alias  # a tensor of the kept entry, not its key: the entry goes with it
    gc.collect()
    assert not cache._entries


def test_an_eviction_inside_the_locked_section_does_not_deadlock():
    # The collector may free a cached tensor (and run its eviction callback) while get holds the lock, when an
    # allocation there triggers a collection: the lock must be reentrant.
    cache, make = VersionCache(), _Maker()
    key = torch.randn(4)
    cache.get(key, (key,), None, make)
    (index, entry), = cache._entries.items()

    def evict_while_locked():
        with cache._lock:
            cache._evict(index, entry.signature)

    worker = threading.Thread(target=evict_while_locked, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the eviction blocked on the lock its own thread holds"
    assert not cache._entries


def test_the_two_caches_key_their_values_as_they_promise(monkeypatch):
    # The wiring of weight_cache and eval_fold_cache onto VersionCache, their operators replaced by counters.
    from gemmbn import eval_fold_cache, weight_cache

    splits = _Maker()
    monkeypatch.setattr(weight_cache, "split_now", lambda weight: splits())
    weight = torch.randn(8, 4)
    first = weight_cache.split_weight(weight)
    assert weight_cache.split_weight(weight) is first and splits.calls == 1
    weight.resize_(4, 8)  # the same storage and element count, another shape
    assert weight_cache.split_weight(weight) is not first and splits.calls == 2
    weight_cache.clear()

    folds = _Maker()
    monkeypatch.setattr(eval_fold_cache, "call", lambda operator, *args: folds())
    monkeypatch.setattr(eval_fold_cache, "operator", lambda name: name)
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    bias, scale, gamma, beta, running_mean, running_var = (torch.randn(3) for _ in range(6))
    vectors = (bias, scale, gamma, beta, running_mean, running_var)
    first = eval_fold_cache.affine(x, w, *vectors, 1e-5)
    assert eval_fold_cache.affine(x, w, *vectors, 1e-5) is first and folds.calls == 1
    assert eval_fold_cache.affine(x, w, *vectors, 1e-3) is not first and folds.calls == 2  # eps
    assert eval_fold_cache.affine(x.double(), w, *vectors, 1e-3) is not None and folds.calls == 3  # x's dtype
    gamma.mul_(2.0)
    eval_fold_cache.affine(x.double(), w, *vectors, 1e-3)
    assert folds.calls == 4
    eval_fold_cache.affine(x.double(), w, None, *vectors[1:], 1e-3)  # no bias now
    assert folds.calls == 5
    eval_fold_cache.clear()
