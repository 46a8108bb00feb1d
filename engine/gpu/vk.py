"""Vulkan, through the `vulkan` cffi binding: the only module that imports it.

What the rest of the engine gets from here:
- `Device`: instance, physical-device choice, the logical device and one compute queue.
- `Allocator` / `Buffer`: sub-allocated device memory; every buffer has a label, a kind and a
  byte count, which the VRAM breakdown and the arbiter add up.
- `Kernel`: a compute pipeline from SPIR-V, with its push-constant block and specialization.
- `CommandList`: dispatches recorded once into a command buffer and replayed per submit.
- `TimestampPool`: GPU timestamps.
- `DeviceFault` / `DeviceLost`: work that failed. Fence waits have no deadline (a slow
  device is not a lost one); after any failed submit, wait or copy the device is made idle
  and its fences reset before the raise, and `Device.faults` / `last_fault` tell upper
  layers that what the failed work wrote is undefined. A lost device refuses every call.
  `inject()` (and HOTSEAT_FAULT=point:kind[:nth], e.g. `submit:timeout:3`) fails the nth
  submit, wait, copy or alloc with a timeout, device_lost or out_of_memory, for tests.

Hot paths (recording, submitting) call `lib.vk*` directly: the wrapper functions cost about
25 us a call against 3 us for the raw ones. The C signature sits in a comment above each.

Why this module is long: it is the one module that imports the binding, so every call into
Vulkan (device choice, memory, uploads, host imports, command buffers, timestamps) lives
here and nowhere else.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import vulkan as _vk
from vulkan import ffi, lib

log = logging.getLogger("hotseat.vk")

KINDS = ("weights", "kv", "recurrent", "compute", "scratch", "staging", "shadow", "pinned",
         "host_weights")
# host memory: not VRAM, whatever heap backs it (host_weights: expert tensors read in place)
HOST_KINDS = ("staging", "shadow", "pinned", "host_weights")


class VulkanError(RuntimeError):
    pass


def check(result: int, what: str) -> None:
    if result != _vk.VK_SUCCESS:
        raise VulkanError(f"{what} failed with VkResult {result}")


# -- faults ---------------------------------------------------------------------------------

FAULT_POINTS = ("submit", "wait", "copy", "alloc")
# the VkResult each injected kind stands for
FAULT_RESULTS = {"timeout": _vk.VK_TIMEOUT, "device_lost": _vk.VK_ERROR_DEVICE_LOST,
                 "out_of_memory": _vk.VK_ERROR_OUT_OF_DEVICE_MEMORY}
_RESULT_KINDS = {_vk.VK_TIMEOUT: "timeout", _vk.VK_ERROR_DEVICE_LOST: "device_lost",
                 _vk.VK_ERROR_OUT_OF_DEVICE_MEMORY: "out_of_memory",
                 _vk.VK_ERROR_OUT_OF_HOST_MEMORY: "out_of_memory"}
WAIT_SLICE_NS = 1_000_000_000     # a fence wait returns every second to look at its deadline


class DeviceFault(VulkanError):
    """Work on the device failed. kind: timeout, device_lost, out_of_memory or error; where:
    the call that failed (submit, wait, copy, alloc). The device was brought back to a known
    state before this was raised (queue idle, fences and one-off command buffers reset), but
    what the failed work was to write is undefined."""

    def __init__(self, kind: str, where: str, result: int, device: str = "", work: str = "",
                 message: str | None = None):
        self.kind, self.where, self.result = kind, where, result
        what = f"{where} of {work}" if work and work != where else where
        super().__init__(message or f"{what} failed on {device or 'the device'}: {kind} "
                                    f"(VkResult {result})")


class DeviceLost(DeviceFault):
    """The device is gone (VK_ERROR_DEVICE_LOST): every later call on it raises this."""


@dataclass
class Fault:
    """An injected failure: the nth call at `point` (counted from when it was armed) fails
    with `kind`. A timeout is reported while the work is still queued or running, as a real
    one is."""
    point: str
    kind: str
    nth: int = 1
    seen: int = 0
    fired: bool = False

    def __post_init__(self):
        if self.point not in FAULT_POINTS:
            raise ValueError(f"fault point {self.point!r} is not one of {', '.join(FAULT_POINTS)}")
        if self.kind not in FAULT_RESULTS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(FAULT_RESULTS)}")
        if self.point == "alloc" and self.kind == "timeout":
            raise ValueError("an allocation cannot time out: inject out_of_memory or device_lost")
        if self.nth < 1:
            raise ValueError(f"fault {self.point}:{self.kind}: the count starts at 1")


_faults: list[Fault] = []
_faults_lock = threading.Lock()


def parse_faults(spec: str) -> list[Fault]:
    """HOTSEAT_FAULT's syntax: `point:kind[:nth]`, comma-separated
    (`submit:timeout:3` fails the 3rd submit with a timeout)."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].isdigit()):
            raise ValueError(f"HOTSEAT_FAULT: {item!r} is not point:kind[:nth]")
        out.append(Fault(parts[0], parts[1], int(parts[2]) if len(parts) == 3 else 1))
    return out


def inject(point: str, kind: str, nth: int = 1) -> Fault:
    """Arm a fault (the test hook; HOTSEAT_FAULT arms them for a whole process)."""
    f = Fault(point, kind, nth)
    with _faults_lock:
        _faults.append(f)
    return f


def clear_faults() -> None:
    with _faults_lock:
        _faults.clear()


def _fire(point: str) -> str | None:
    """The kind of fault the current call at `point` must fail with, if one is armed."""
    if not _faults:
        return None
    with _faults_lock:
        kind = None
        for f in _faults:
            if f.point == point and not f.fired:
                f.seen += 1
                if f.seen == f.nth and kind is None:
                    f.fired, kind = True, f.kind
        return kind


_faults.extend(parse_faults(os.environ.get("HOTSEAT_FAULT", "")))


def seconds_setting(name: str) -> float:
    """$name as seconds, 0 or more; 0 where it is unset."""
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value or 0)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:                  # NaN too
        raise ValueError(f"{name}: {value!r} is not a number of seconds, 0 or more")
    return seconds


def _version_str(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


# -- device choice --------------------------------------------------------------------------

_TYPE_RANK = {
    _vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0,
    _vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1,
    _vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: 2,
    _vk.VK_PHYSICAL_DEVICE_TYPE_CPU: 3,
    _vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: 4,
}
_TYPE_NAME = {0: "discrete", 1: "integrated", 2: "virtual", 3: "cpu", 4: "other"}


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    kind: str              # discrete / integrated / virtual / cpu / other
    vendor_id: int         # PCI vendor: 0x1002 AMD, 0x10DE NVIDIA, 0x8086 Intel
    api_version: str
    device_id: int = 0     # PCI device id (the driver's own number for CPU devices)


def choose_device(infos: list[DeviceInfo], wanted: str | None) -> DeviceInfo:
    """Discrete GPU first, lavapipe last; HOTSEAT_DEVICE picks by index or name substring."""
    if not infos:
        raise VulkanError("no Vulkan device found (install mesa-vulkan-drivers for lavapipe)")
    if wanted:
        if wanted.isdigit():
            for info in infos:
                if info.index == int(wanted):
                    return info
        for info in infos:
            if wanted.lower() in info.name.lower():
                return info
        names = ", ".join(f"{i.index}: {i.name}" for i in infos)
        raise VulkanError(f"HOTSEAT_DEVICE={wanted!r} matches no Vulkan device ({names})")
    order = list(_TYPE_NAME.values())
    return sorted(infos, key=lambda i: (order.index(i.kind), i.index))[0]


# -- the device -----------------------------------------------------------------------------

class Device:
    """One Vulkan device with a compute queue, a command pool and a pipeline cache."""

    def __init__(self, wanted: str | None = None, cache_dir: str | None = None):
        self._lock = threading.RLock()      # the queue, and the recovery after a fault
        # Faults: work that failed, after which what it wrote is undefined (upper layers
        # compare `faults` before and after their work); a lost device refuses everything.
        self.faults = 0
        self.last_fault: DeviceFault | None = None
        self.lost = False
        self._fence_pending = False          # a submit(wait=False) not waited for yet
        # No deadline by default: a slow device is not a lost one. HOTSEAT_FENCE_LIMIT_S sets
        # one (a fence not signalled by then is a timeout fault).
        limit = seconds_setting("HOTSEAT_FENCE_LIMIT_S")
        self.fence_limit_s: float | None = limit if limit > 0 else None
        # HOTSEAT_WAIT_MIN_S: each fence wait lasts this long at least, a slow device's pace
        # (tests that cut into a request: on a fast GPU it is otherwise over first)
        self.wait_min_s = seconds_setting("HOTSEAT_WAIT_MIN_S")
        app = _vk.VkApplicationInfo(pApplicationName="hotseat", applicationVersion=1,
                                    pEngineName="hotseat", engineVersion=1,
                                    apiVersion=_instance_version())
        exts = [e.extensionName for e in _vk.vkEnumerateInstanceExtensionProperties(None)]
        flags = 0
        enabled = []
        if "VK_KHR_portability_enumeration" in exts:
            enabled.append("VK_KHR_portability_enumeration")
            flags |= 0x00000001  # VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR
        try:
            self.instance = _vk.vkCreateInstance(_vk.VkInstanceCreateInfo(
                pApplicationInfo=app, flags=flags, ppEnabledExtensionNames=enabled), None)
        except _vk.VkError as exc:
            raise VulkanError(f"cannot create a Vulkan instance ({type(exc).__name__}); "
                              "is libvulkan1 with a driver installed?") from None
        physicals = _vk.vkEnumeratePhysicalDevices(self.instance)
        infos = []
        for i, pd in enumerate(physicals):
            p = _vk.vkGetPhysicalDeviceProperties(pd)
            infos.append(DeviceInfo(i, ffi.string(p.deviceName).decode()
                                    if not isinstance(p.deviceName, str) else p.deviceName,
                                    _TYPE_NAME[_TYPE_RANK.get(p.deviceType, 4)], p.vendorID,
                                    _version_str(p.apiVersion), p.deviceID))
        self.all_devices = infos
        self.info = choose_device(infos, wanted if wanted is not None
                                  else os.environ.get("HOTSEAT_DEVICE"))
        self.physical = physicals[self.info.index]
        self.name = self.info.name
        props = _vk.vkGetPhysicalDeviceProperties(self.physical)
        self.limits = props.limits
        # the version this device is used at: its own, at most the instance's
        self.api_version = min(int(props.apiVersion), _instance_version())
        self.timestamp_period_ns = float(props.limits.timestampPeriod)
        self.max_storage_range = int(props.limits.maxStorageBufferRange)
        self.storage_align = int(props.limits.minStorageBufferOffsetAlignment)
        self.max_shared = int(props.limits.maxComputeSharedMemorySize)
        self.max_wg_invocations = int(props.limits.maxComputeWorkGroupInvocations)
        sub = _vk.VkPhysicalDeviceSubgroupProperties()
        p2 = _vk.VkPhysicalDeviceProperties2(pNext=sub)
        _vk.vkGetPhysicalDeviceProperties2(self.physical, p2)
        self.subgroup_size = int(sub.subgroupSize)
        self.pipeline_cache_uuid = bytes(ffi.buffer(props.pipelineCacheUUID, 16))
        dev_exts = {e.extensionName for e in
                    _vk.vkEnumerateDeviceExtensionProperties(self.physical, None)}
        self.extensions = dev_exts
        self.has_memory_budget = "VK_EXT_memory_budget" in dev_exts
        self.has_external_host = "VK_EXT_external_memory_host" in dev_exts
        # device memory shared between processes as opaque fds (the arena's pool)
        self.shares_memory = "VK_KHR_external_memory_fd" in dev_exts

        self.host_import_align = 0            # VK_EXT_external_memory_host, if present
        # NVIDIA's driver (580) refuses file-backed pages (VK_ERROR_OUT_OF_DEVICE_MEMORY),
        # and after a refused import its later 256 MiB host allocations failed as well: only
        # anonymous memory is imported there
        self.imports_file_pages = self.info.vendor_id != NVIDIA_VENDOR
        if self.has_external_host:
            ext = _vk.VkPhysicalDeviceExternalMemoryHostPropertiesEXT()
            _vk.vkGetPhysicalDeviceProperties2(self.physical,
                                               _vk.VkPhysicalDeviceProperties2(pNext=ext))
            self.host_import_align = int(ext.minImportedHostPointerAlignment)
        self.compute_units = self._compute_units(dev_exts)
        self.max_allocation = 1 << 30
        m3 = _vk.VkPhysicalDeviceMaintenance3Properties()
        _vk.vkGetPhysicalDeviceProperties2(self.physical, _vk.VkPhysicalDeviceProperties2(pNext=m3))
        self.max_allocation = int(m3.maxMemoryAllocationSize) or self.max_allocation

        self._pick_memory_types()
        qf = _vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        fam = [i for i, q in enumerate(qf) if q.queueFlags & _vk.VK_QUEUE_COMPUTE_BIT]
        if not fam:
            raise VulkanError(f"{self.name}: no compute queue")
        # A compute-only family avoids contending with the desktop's graphics work.
        only = [i for i in fam if not qf[i].queueFlags & _vk.VK_QUEUE_GRAPHICS_BIT]
        self.queue_family = (only or fam)[0]
        self.timestamps_ok = qf[self.queue_family].timestampValidBits > 0

        f11 = _vk.VkPhysicalDeviceVulkan11Features()
        f12 = _vk.VkPhysicalDeviceVulkan12Features(pNext=f11)
        feats = _vk.VkPhysicalDeviceFeatures2(pNext=f12)
        _vk.vkGetPhysicalDeviceFeatures2(self.physical, feats)
        if not f11.storageBuffer16BitAccess:
            raise VulkanError(f"{self.name}: lacks 16-bit storage buffers (needed for f16 KV)")
        self.has_float16 = bool(f12.shaderFloat16)
        # The matrix units: KHR cooperative matrices of 16x16x16 f16 products with f32 sums
        # in subgroup scope (the prefill product's shape); their shaders also use the Vulkan
        # memory model.
        self.coopmat = (self.has_float16 and bool(f12.vulkanMemoryModel)
                        and "VK_KHR_cooperative_matrix" in dev_exts
                        and self._coopmat_16x16x16())
        # NVIDIA's workgroup-scope matrices (VK_NV_cooperative_matrix2: mul_mat_cm2), on top
        # of the KHR ones; their SPIR-V is 1.6 (Vulkan 1.3) and their decode functions take
        # buffer addresses. $HOTSEAT_COOPMAT2=off opens the device as without them.
        self.coopmat2 = (coopmat2_asked() and self.coopmat and bool(f12.bufferDeviceAddress)
                         and self.api_version >= _vk.VK_MAKE_VERSION(1, 3, 0)
                         and "VK_NV_cooperative_matrix2" in dev_exts
                         and self._coopmat2_features() and self._coopmat2_workgroups()
                         and self._maintenance4())
        # 4-wide int8 dot products (mul_mat_vecq, the decode product with int8 activations)
        self.dot4 = False
        if "VK_KHR_shader_integer_dot_product" in dev_exts:
            fdot = _vk.VkPhysicalDeviceShaderIntegerDotProductFeatures()
            _vk.vkGetPhysicalDeviceFeatures2(self.physical,
                                             _vk.VkPhysicalDeviceFeatures2(pNext=fdot))
            self.dot4 = bool(fdot.shaderIntegerDotProduct)
        # (with the Vulkan 1.3 struct in the chain, the int8 dot products are asked there)
        dot = self.dot4 and not self.coopmat2
        want11 = _vk.VkPhysicalDeviceVulkan11Features(
            storageBuffer16BitAccess=_vk.VK_TRUE,
            pNext=_vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(
                shaderIntegerDotProduct=_vk.VK_TRUE) if dot else None)
        # (SPIR-V 1.6's spec-constant workgroup size, LocalSizeId, needs maintenance4)
        want_cm2 = self._coopmat2_chain(_vk.VkPhysicalDeviceVulkan13Features(
            pNext=want11, maintenance4=_vk.VK_TRUE,
            shaderIntegerDotProduct=_vk.VK_TRUE if self.dot4 else None)) \
            if self.coopmat2 else want11
        want_cm = (_vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(
            pNext=want_cm2, cooperativeMatrix=_vk.VK_TRUE) if self.coopmat else want11)
        want12 = _vk.VkPhysicalDeviceVulkan12Features(
            pNext=want_cm, storageBuffer8BitAccess=f12.storageBuffer8BitAccess or None,
            shaderInt8=f12.shaderInt8 or None, shaderFloat16=f12.shaderFloat16 or None,
            hostQueryReset=f12.hostQueryReset or None,
            vulkanMemoryModel=_vk.VK_TRUE if self.coopmat else None,
            bufferDeviceAddress=_vk.VK_TRUE if self.coopmat2 else None)
        # buffers whose addresses shaders may take (mul_mat_cm2's decode functions)
        self.buffer_usage = BUFFER_USAGE | (SHADER_DEVICE_ADDRESS if self.coopmat2 else 0)
        self.host_query_reset = bool(f12.hostQueryReset)
        want = _vk.VkPhysicalDeviceFeatures2(pNext=want12, features=_vk.VkPhysicalDeviceFeatures(
            shaderInt16=feats.features.shaderInt16 or None,
            shaderInt64=feats.features.shaderInt64 or None))
        enable = [e for e in ("VK_EXT_memory_budget", "VK_EXT_external_memory_host",
                              "VK_KHR_external_memory_fd") if e in dev_exts] \
            + (["VK_KHR_cooperative_matrix"] if self.coopmat else []) \
            + (["VK_NV_cooperative_matrix2"] if self.coopmat2 else []) \
            + (["VK_KHR_shader_integer_dot_product"] if self.dot4 else [])
        qinfo = _vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family,
                                            queueCount=1, pQueuePriorities=[1.0])
        self.device = _vk.vkCreateDevice(self.physical, _vk.VkDeviceCreateInfo(
            pNext=want, pQueueCreateInfos=[qinfo], ppEnabledExtensionNames=enable), None)
        self.queue = _vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        self.command_pool = _vk.vkCreateCommandPool(self.device, _vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.queue_family,
            flags=_vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
        self.fence = _vk.vkCreateFence(self.device, _vk.VkFenceCreateInfo(), None)
        self._cache_path = None
        self.pipeline_cache = self._open_pipeline_cache(cache_dir)
        self.allocator = Allocator(self)

    def _compute_units(self, dev_exts: set[str]) -> int:
        """The GPU's streaming multiprocessors (NVIDIA) or compute units (AMD), where the
        driver tells them (VK_NV_shader_sm_builtins, VK_AMD_shader_core_properties); else 0."""
        if "VK_NV_shader_sm_builtins" in dev_exts:
            sm = _vk.VkPhysicalDeviceShaderSMBuiltinsPropertiesNV()
            _vk.vkGetPhysicalDeviceProperties2(self.physical,
                                               _vk.VkPhysicalDeviceProperties2(pNext=sm))
            return int(sm.shaderSMCount)
        if "VK_AMD_shader_core_properties" in dev_exts:
            core = _vk.VkPhysicalDeviceShaderCorePropertiesAMD()
            _vk.vkGetPhysicalDeviceProperties2(self.physical,
                                               _vk.VkPhysicalDeviceProperties2(pNext=core))
            return int(core.shaderEngineCount * core.shaderArraysPerEngineCount
                       * core.computeUnitsPerShaderArray)
        return 0

    def _coopmat_16x16x16(self) -> bool:
        """Whether the driver lists 16x16x16 f16 x f16 + f32 cooperative matrices in subgroup
        scope (vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)."""
        name = b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
        ptr = lib.vkGetInstanceProcAddr(self.instance, name)
        if ptr == ffi.NULL:
            return False
        # VkResult (VkPhysicalDevice, uint32_t* count, VkCooperativeMatrixPropertiesKHR*)
        fn = ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", ptr)
        count = ffi.new("uint32_t*")
        if fn(self.physical, count, ffi.NULL) != _vk.VK_SUCCESS or not count[0]:
            return False
        props = ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
        for i in range(count[0]):
            props[i].sType = _vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
        if fn(self.physical, count, props) != _vk.VK_SUCCESS:
            return False
        f16, f32 = _vk.VK_COMPONENT_TYPE_FLOAT16_KHR, _vk.VK_COMPONENT_TYPE_FLOAT32_KHR
        return any((p.MSize, p.NSize, p.KSize, p.AType, p.BType, p.CType, p.ResultType, p.scope)
                   == (16, 16, 16, f16, f16, f32, f32, _vk.VK_SCOPE_SUBGROUP_KHR)
                   for p in props[0:count[0]])

    def _coopmat2_features(self) -> bool:
        """Whether VK_NV_cooperative_matrix2 gives all that the cm2 kernels use (every one
        of its seven features: COOPMAT2_USED)."""
        feats = ffi.new("uint32_t[12]")       # sType, pNext, then 7 VkBool32
        feats[0] = COOPMAT2_FEATURES
        _vk.vkGetPhysicalDeviceFeatures2(self.physical, _vk.VkPhysicalDeviceFeatures2(
            pNext=ffi.cast("void*", feats)))
        # workgroup scope, flexible dimensions, reductions, conversions, per-element
        # operations, tensor addressing, block loads
        return all(feats[4 + i] for i in COOPMAT2_USED)

    def _coopmat2_chain(self, nxt):
        """The VK_NV_cooperative_matrix2 features the cm2 kernels use, as a pNext link before
        nxt (the binding predates the extension: its struct laid out by hand)."""
        feats = ffi.new("uint32_t[12]")
        feats[0] = COOPMAT2_FEATURES
        ffi.cast("void**", feats + 2)[0] = ffi.cast("void*", ffi.addressof(nxt))
        for i in COOPMAT2_USED:
            feats[4 + i] = 1
        self._keep = (feats, nxt)            # alive until vkCreateDevice has read them
        return ffi.cast("void*", feats)

    def _maintenance4(self) -> bool:
        """Whether the Vulkan 1.3 device has maintenance4 (workgroup sizes given by
        specialization constants in SPIR-V 1.6, as mul_mat_cm2's are)."""
        f13 = _vk.VkPhysicalDeviceVulkan13Features()
        _vk.vkGetPhysicalDeviceFeatures2(self.physical, _vk.VkPhysicalDeviceFeatures2(pNext=f13))
        return bool(f13.maintenance4)

    def _coopmat2_workgroups(self) -> bool:
        """Whether the driver lists f16 x f16 + f32 workgroup-scope products for workgroups
        of 256 lanes (vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV)
        whose granularity divides mul_mat_cm2's tiles (multiples of 64)."""
        name = b"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV"
        ptr = lib.vkGetInstanceProcAddr(self.instance, name)
        if ptr == ffi.NULL:
            return False
        fn = ffi.cast("VkResult (*)(VkPhysicalDevice, uint32_t*, void*)", ptr)
        count = ffi.new("uint32_t*")
        if fn(self.physical, count, ffi.NULL) != _vk.VK_SUCCESS or not count[0]:
            return False
        # each entry 14 u32: sType, (pad), pNext (2), M, N, K granularity, A, B, C and
        # result types, saturating, scope, workgroup invocations
        props = ffi.new("uint32_t[]", 14 * count[0])
        for i in range(count[0]):
            props[14 * i] = COOPMAT2_FLEXIBLE
        if fn(self.physical, count, props) != _vk.VK_SUCCESS:
            return False
        f16, f32 = _vk.VK_COMPONENT_TYPE_FLOAT16_KHR, _vk.VK_COMPONENT_TYPE_FLOAT32_KHR
        for i in range(count[0]):
            m, n, k, a, b, c, r, sat, scope, lanes = props[14 * i + 4:14 * i + 14]
            if (a, b, c, r, sat, scope, lanes) == (f16, f16, f32, f32, 0,
                                                   _vk.VK_SCOPE_WORKGROUP_KHR, 256) \
                    and 64 % m == 0 and 64 % n == 0 and 64 % k == 0:
                return True
        return False

    # -- memory types -----------------------------------------------------------------------
    def _pick_memory_types(self) -> None:
        mp = _vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.memory_types = [(mp.memoryTypes[i].propertyFlags, mp.memoryTypes[i].heapIndex)
                             for i in range(mp.memoryTypeCount)]
        self.heaps = [(int(mp.memoryHeaps[i].size), mp.memoryHeaps[i].flags)
                      for i in range(mp.memoryHeapCount)]
        DL = _vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        HV = _vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        HC = _vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        CA = _vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT

        def find(required: int, preferred: int = 0, avoid: int = 0) -> int:
            best, best_score = -1, -1
            for i, (flags, _) in enumerate(self.memory_types):
                if flags & required != required:
                    continue
                score = 4 * bin(flags & preferred).count("1") - bin(flags & avoid).count("1")
                if score > best_score:
                    best, best_score = i, score
            return best

        self.mem_device = find(DL, avoid=HV)
        if self.mem_device < 0:
            self.mem_device = find(0)
        self.mem_host = find(HV | HC, preferred=CA)
        # Unified memory (lavapipe, APUs): device memory is mapped and written directly.
        self.unified = bool(self.memory_types[self.mem_device][0] & HV)
        self.device_heap_bytes = self.heaps[self.memory_types[self.mem_device][1]][0]

    def memory_budget(self) -> tuple[int, int] | None:
        """(budget, usage) of the device-local heap from VK_EXT_memory_budget, if present."""
        if not self.has_memory_budget:
            return None
        b = _vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT()
        p = _vk.VkPhysicalDeviceMemoryProperties2(pNext=b)
        _vk.vkGetPhysicalDeviceMemoryProperties2(self.physical, p)
        heap = self.memory_types[self.mem_device][1]
        return int(b.heapBudget[heap]), int(b.heapUsage[heap])

    # -- pipeline cache ---------------------------------------------------------------------
    def _open_pipeline_cache(self, cache_dir: str | None):
        data = b""
        if cache_dir is None:
            import platformdirs
            cache_dir = platformdirs.user_cache_dir("hotseat")
        try:
            os.makedirs(cache_dir, exist_ok=True)
            self._cache_path = os.path.join(
                cache_dir, f"pipelines-{self.pipeline_cache_uuid.hex()}.bin")
            if os.path.exists(self._cache_path):
                with open(self._cache_path, "rb") as f:
                    data = f.read()
        except OSError:
            self._cache_path = None
        info = _vk.VkPipelineCacheCreateInfo(initialDataSize=len(data),
                                             pInitialData=ffi.from_buffer(data) if data else None)
        try:
            return _vk.vkCreatePipelineCache(self.device, info, None)
        except _vk.VkError:  # a stale or foreign cache file: start empty
            return _vk.vkCreatePipelineCache(self.device, _vk.VkPipelineCacheCreateInfo(), None)

    def save_pipeline_cache(self) -> None:
        if not self._cache_path:
            return
        size = ffi.new("size_t*")
        # VkResult vkGetPipelineCacheData(VkDevice, VkPipelineCache, size_t*, void*)
        check(lib.vkGetPipelineCacheData(self.device, self.pipeline_cache, size, ffi.NULL),
              "vkGetPipelineCacheData")
        buf = ffi.new("char[]", size[0])
        check(lib.vkGetPipelineCacheData(self.device, self.pipeline_cache, size, buf),
              "vkGetPipelineCacheData")
        tmp = self._cache_path + f".{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(ffi.buffer(buf, size[0]))
            os.replace(tmp, self._cache_path)
        except OSError:
            pass

    # -- submission ----------------------------------------------------------------------
    def check_alive(self) -> None:
        """Raise DeviceLost once the device is lost (or closed), instead of calling into it."""
        if self.lost:
            raise DeviceLost("device_lost", "call", _vk.VK_ERROR_DEVICE_LOST, message=(
                f"the Vulkan device {self.name} was lost ({self.last_fault}); nothing more "
                "runs on it until hotseat is restarted"))
        if self.device is None:
            raise VulkanError(f"{self.name}: the device is closed")

    def submit(self, command_buffers: list, wait: bool = True, point: str = "submit") -> None:
        """Submit command buffers in one vkQueueSubmit and (by default) wait for them.
        point: "submit" for compute work, "copy" for transfers (fault injection and the
        fault's wording). Any failure raises DeviceFault with the device made idle."""
        self.check_alive()
        with self._lock:
            if self._fence_pending:
                self._wait_fences([self.fence], point)
            arr = ffi.new("VkCommandBuffer[]", command_buffers)
            info = ffi.new("VkSubmitInfo*", {"sType": _vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                             "commandBufferCount": len(command_buffers),
                                             "pCommandBuffers": arr})
            kind = _fire(point)
            if kind is not None and kind != "timeout":
                r = FAULT_RESULTS[kind]              # refused: nothing was queued
            else:
                # VkResult vkQueueSubmit(VkQueue, uint32_t, const VkSubmitInfo*, VkFence)
                r = lib.vkQueueSubmit(self.queue, 1, info, self.fence)
            if r != _vk.VK_SUCCESS:
                raise self._fault(r, point, [self.fence], work=point)
            if kind == "timeout":                    # queued, and reported while it runs
                raise self._fault(_vk.VK_TIMEOUT, point, [self.fence], work=point)
            self._fence_pending = True
            if wait:
                self._wait_fences([self.fence], point)

    def wait(self) -> None:
        """Wait for the work of a submit(wait=False)."""
        with self._lock:
            if self._fence_pending:
                self._wait_fences([self.fence], "submit")

    def _wait_fences(self, fences: list, work: str) -> None:
        """Wait until every fence is signalled, then reset them. No deadline unless
        fence_limit_s is set: the wait is retried on VK_TIMEOUT."""
        n = len(fences)
        arr = ffi.new("VkFence[]", fences)
        kind = _fire("wait")
        if kind is not None:
            r = FAULT_RESULTS[kind]                  # the work goes on running
        else:
            if self.wait_min_s > 0:
                time.sleep(self.wait_min_s)
            deadline = None if self.fence_limit_s is None \
                else time.monotonic() + self.fence_limit_s
            while True:
                # VkResult vkWaitForFences(VkDevice, uint32_t, const VkFence*, VkBool32,
                #                          uint64_t timeout_ns)
                r = lib.vkWaitForFences(self.device, n, arr, 1, WAIT_SLICE_NS)
                if r != _vk.VK_TIMEOUT or (deadline is not None
                                           and time.monotonic() >= deadline):
                    break
        if r != _vk.VK_SUCCESS:
            raise self._fault(r, "wait", fences, work=work)
        # VkResult vkResetFences(VkDevice, uint32_t, const VkFence*)
        r = lib.vkResetFences(self.device, n, arr)
        if r != _vk.VK_SUCCESS:
            raise self._fault(r, "wait", fences, work=work)
        if self.fence in fences:
            self._fence_pending = False

    def _fault(self, result: int, where: str, fences: list = (), command_buffers: list = (),
              work: str = "") -> DeviceFault:
        """Bring the device back to a known state after a failed call and return the error
        to raise: wait for the queue to go idle (the failed work may still be running),
        reset the fences and the one-off command buffers involved, count the fault. Recorded
        command buffers (graphs) are left alone: once idle they can be submitted again."""
        kind = _RESULT_KINDS.get(result, "error")
        with self._lock:
            # VkResult vkQueueWaitIdle(VkQueue)
            idle = lib.vkQueueWaitIdle(self.queue)
            if kind == "device_lost" or idle == _vk.VK_ERROR_DEVICE_LOST:
                self.lost = True
            if fences:
                lib.vkResetFences(self.device, len(fences), ffi.new("VkFence[]", list(fences)))
            for cmd in command_buffers:
                # VkResult vkResetCommandBuffer(VkCommandBuffer, VkCommandBufferResetFlags)
                lib.vkResetCommandBuffer(cmd, 0)
            if self.fence in fences:
                self._fence_pending = False
            err = (DeviceLost if self.lost else DeviceFault)(
                "device_lost" if self.lost else kind, where, result, self.name, work)
            self.faults += 1
            self.last_fault = err
        log.error("%s%s", err, "; the device is lost" if self.lost else
                  f" (queue idle: VkResult {idle})")
        return err

    def one_shot(self):
        """A command buffer for one-off work (copies), submitted when the block ends."""
        return _OneShot(self)

    def close(self) -> None:
        if self.device is None:
            return
        # VkResult vkDeviceWaitIdle(VkDevice): an error here (a lost device) changes nothing
        lib.vkDeviceWaitIdle(self.device)
        if not self.lost:
            self.save_pipeline_cache()
        self.allocator.close()
        _vk.vkDestroyPipelineCache(self.device, self.pipeline_cache, None)
        _vk.vkDestroyFence(self.device, self.fence, None)
        _vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        _vk.vkDestroyDevice(self.device, None)
        _vk.vkDestroyInstance(self.instance, None)
        self.device = None

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _OneShot:
    def __init__(self, dev: Device):
        self.dev = dev

    def __enter__(self):
        self.dev.check_alive()
        self.cmd = allocate_command_buffer(self.dev)
        begin(self.cmd, one_time=True)
        return self.cmd

    def __exit__(self, exc_type, *rest):
        try:
            host_barrier(self.cmd)
            end(self.cmd)
            if exc_type is None:
                self.dev.submit([self.cmd], point="copy")
        finally:
            _vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, 1, [self.cmd])


def allocate_command_buffer(dev: Device):
    return _vk.vkAllocateCommandBuffers(dev.device, _vk.VkCommandBufferAllocateInfo(
        commandPool=dev.command_pool, level=_vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        commandBufferCount=1))[0]


def begin(cmd, one_time: bool = False) -> None:
    flags = _vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT if one_time else 0
    _vk.vkBeginCommandBuffer(cmd, _vk.VkCommandBufferBeginInfo(flags=flags))


def end(cmd) -> None:
    _vk.vkEndCommandBuffer(cmd)


_HOST_BARRIER = None


def host_barrier(cmd) -> None:
    """Make the device's writes so far visible to host reads after the fence wait."""
    global _HOST_BARRIER
    if _HOST_BARRIER is None:
        _HOST_BARRIER = ffi.new("VkMemoryBarrier*", {
            "sType": _vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": _vk.VK_ACCESS_SHADER_WRITE_BIT | _vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": _vk.VK_ACCESS_HOST_READ_BIT})
    src = _vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | _vk.VK_PIPELINE_STAGE_TRANSFER_BIT
    lib.vkCmdPipelineBarrier(cmd, src, _vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, _HOST_BARRIER,
                             0, ffi.NULL, 0, ffi.NULL)


# -- memory ---------------------------------------------------------------------------------

BLOCK_BYTES = 256 << 20
BUFFER_USAGE = (_vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | _vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                | _vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT | _vk.VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT)


SHADER_DEVICE_ADDRESS = 0x00020000        # VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT
ALLOCATE_DEVICE_ADDRESS = 0x00000002      # VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT
COOPMAT2_FEATURES = 1000593000            # VK_NV_cooperative_matrix2's structure types
COOPMAT2_FLEXIBLE = 1000593001
COOPMAT2_USED = (0, 1, 2, 3, 4, 5, 6)     # its features the cm2 kernels use: workgroup
                                          # scope, flexible dimensions, reductions and
                                          # conversions (flash_attn_cm2), per-element
                                          # operations, tensor addressing, block loads


def coopmat2_asked() -> bool:
    """$HOTSEAT_COOPMAT2: unset or on asks for NVIDIA's workgroup-scope matrices where the
    device has them; off keeps KHR's subgroup-scope ones (and Vulkan 1.2)."""
    value = os.environ.get("HOTSEAT_COOPMAT2", "").strip()
    if value not in ("", "on", "off"):
        raise ValueError(f"HOTSEAT_COOPMAT2: {value!r} is not on or off")
    return value != "off"


def _instance_version() -> int:
    """Vulkan 1.3 where mul_mat_cm2 is asked for and the loader has it (its SPIR-V 1.6 needs
    it), else 1.2."""
    if not coopmat2_asked():
        return _vk.VK_MAKE_VERSION(1, 2, 0)
    try:
        have = _vk.vkEnumerateInstanceVersion()
    except Exception:
        return _vk.VK_MAKE_VERSION(1, 2, 0)
    return min(have, _vk.VK_MAKE_VERSION(1, 3, 0)) if have >= _vk.VK_MAKE_VERSION(1, 2, 0) \
        else _vk.VK_MAKE_VERSION(1, 2, 0)


OPAQUE_FD = _vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT


def _allocate_memory(dev: Device, size: int, type_index: int, pnext=ffi.NULL):
    """(VkResult, VkDeviceMemory) of one vkAllocateMemory, pnext chained (an import or an
    export); raw, as buffers are."""
    info = ffi.new("VkMemoryAllocateInfo*", {
        "sType": _vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, "pNext": pnext,
        "allocationSize": size, "memoryTypeIndex": type_index})
    out = ffi.new("VkDeviceMemory*")
    # VkResult vkAllocateMemory(VkDevice, const VkMemoryAllocateInfo*,
    #                           const VkAllocationCallbacks*, VkDeviceMemory*)
    r = lib.vkAllocateMemory(dev.device, info, ffi.NULL, out)
    return r, out[0]


class _Block:
    """One VkDeviceMemory carved into buffers by first fit.

    export: the memory can be shared with other processes (`export_fd()`); fd: the memory
    is another process's, imported from its opaque fd (the driver takes the fd). Both are
    `shared`: such a block belongs to a pool (engine/residency/pool.py), not to the
    allocator, and goes back to it when it empties."""

    def __init__(self, dev: Device, type_index: int, size: int, host: bool = False,
                 export: bool = False, fd: int | None = None):
        self.dev, self.type_index, self.size = dev, type_index, size
        self.host = host                 # serves host-memory requests (shadows, staging)
        self.shared = export or fd is not None
        self.pool_id: str | None = None
        nxt = ffi.NULL
        if export:
            nxt = ffi.new("VkExportMemoryAllocateInfo*", {
                "sType": _vk.VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
                "handleTypes": OPAQUE_FD})
        elif fd is not None:
            nxt = ffi.new("VkImportMemoryFdInfoKHR*", {
                "sType": _vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                "handleType": OPAQUE_FD, "fd": fd})
        link = nxt          # cffi frees a struct with its last Python reference, not with a
                            # pointer to it in another struct: `link` keeps the export or
                            # import alive under the flags below until the allocation is made
        if dev.buffer_usage & SHADER_DEVICE_ADDRESS:     # its buffers' addresses may be taken
            nxt = ffi.new("VkMemoryAllocateFlagsInfo*", {
                "sType": _vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO, "pNext": link,
                "flags": ALLOCATE_DEVICE_ADDRESS})
        r, memory = _allocate_memory(dev, size, type_index, nxt)
        if r in (_vk.VK_ERROR_OUT_OF_DEVICE_MEMORY, _vk.VK_ERROR_OUT_OF_HOST_MEMORY):
            raise OutOfMemory(f"cannot allocate {size >> 20} MiB on {dev.name}")
        check(r, "vkAllocateMemory")
        self.memory = memory
        self.free = [(0, size)]          # sorted (offset, size) holes
        self.used = 0
        self.mapped = None
        flags = dev.memory_types[type_index][0]
        if flags & _vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT:
            pp = ffi.new("void**")
            # VkResult vkMapMemory(VkDevice, VkDeviceMemory, VkDeviceSize, VkDeviceSize,
            #                      VkMemoryMapFlags, void**)
            check(lib.vkMapMemory(dev.device, self.memory, 0, size, 0, pp), "vkMapMemory")
            self.mapped = np.frombuffer(ffi.buffer(pp[0], size), dtype=np.uint8)

    def export_fd(self) -> int:
        """A new opaque fd of this memory, for another process to import (the caller owns
        it: closing it, or the importer's driver, releases it)."""
        get = ffi.cast("PFN_vkGetMemoryFdKHR",
                       lib.vkGetDeviceProcAddr(self.dev.device, b"vkGetMemoryFdKHR"))
        info = ffi.new("VkMemoryGetFdInfoKHR*", {
            "sType": _vk.VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR, "memory": self.memory,
            "handleType": OPAQUE_FD})
        fd = ffi.new("int*")
        check(get(self.dev.device, info, fd), "vkGetMemoryFdKHR")
        return fd[0]

    def take(self, size: int, align: int) -> int | None:
        for i, (off, n) in enumerate(self.free):
            start = -(-off // align) * align
            if start + size <= off + n:
                rest = []
                if start > off:
                    rest.append((off, start - off))
                if start + size < off + n:
                    rest.append((start + size, off + n - start - size))
                self.free[i:i + 1] = rest
                self.used += size
                return start
        return None

    def give(self, off: int, size: int) -> None:
        self.used -= size
        self.free.append((off, size))
        self.free.sort()
        merged = [self.free[0]]
        for o, n in self.free[1:]:
            po, pn = merged[-1]
            if po + pn == o:
                merged[-1] = (po, pn + n)
            else:
                merged.append((o, n))
        self.free = merged

    def close(self) -> None:
        if self.mapped is not None:
            self.mapped = None
            _vk.vkUnmapMemory(self.dev.device, self.memory)
        # void vkFreeMemory(VkDevice, VkDeviceMemory, const VkAllocationCallbacks*)
        lib.vkFreeMemory(self.dev.device, self.memory, ffi.NULL)


class OutOfMemory(VulkanError):
    pass


@dataclass(eq=False)
class Buffer:
    """A labelled storage buffer: `kind` is one of KINDS; `host` buffers are CPU-mapped."""
    label: str
    kind: str
    nbytes: int
    host: bool
    handle: object = None
    block: _Block | None = None
    offset: int = 0
    alloc_bytes: int = 0
    view: np.ndarray | None = field(default=None, repr=False)   # mapped bytes, if mappable
    memory: object = None                 # its own VkDeviceMemory (imported host pages)

    @property
    def released(self) -> bool:
        return self.handle is None

    def write(self, data, offset: int = 0) -> None:
        """Host write into a mapped buffer (host buffers, or any buffer on unified memory)."""
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        self.view[offset:offset + src.nbytes] = src

    def read(self, dtype=np.float32, count: int | None = None, offset: int = 0) -> np.ndarray:
        n = (self.nbytes - offset) if count is None else count * np.dtype(dtype).itemsize
        return self.view[offset:offset + n].view(dtype).copy()


class Allocator:
    """Sub-allocates buffers from large memory blocks and keeps per-kind byte totals."""

    def __init__(self, dev: Device):
        self.dev = dev
        self.blocks: list[_Block] = []
        self.buffers: set[Buffer] = set()
        # Emptied device-local blocks are kept as spares while everything reserved stays
        # within spare_limit (the engine sets its VRAM budget): the next model's buffers
        # then bind to memory already allocated, as vkAllocateMemory of a large block costs
        # milliseconds. trim() gives them back.
        self.spare: list[_Block] = []
        self.spare_limit = 0
        self.host_spare: _Block | None = None   # one emptied host block (mapping is slow)
        # With a pool (engine/residency/pool.py), new device blocks are memory shared with
        # the arena's other processes: pool.take(type_index, size) gives one mapped here,
        # pool.give(block) takes it back once emptied. Its memory stays mapped in every
        # process, so that a turn on the GPU needs no vkAllocateMemory (20 ms per GiB).
        self.pool = None

    def alloc(self, nbytes: int, label: str, kind: str, host: bool = False) -> Buffer:
        if kind not in KINDS:
            raise ValueError(f"unknown buffer kind {kind!r}")
        nbytes = max(int(nbytes), 4)
        dev = self.dev
        dev.check_alive()
        fault = _fire("alloc")
        if fault == "out_of_memory":
            raise OutOfMemory(f"cannot allocate {nbytes} bytes for {label} on {dev.name} "
                              "(injected)")
        if fault is not None:
            raise dev._fault(FAULT_RESULTS[fault], "alloc", work=label)
        # raw calls: a full restore creates a buffer per KV layer, and the wrappers cost
        # ~25 us each against ~3 us
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": _vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": nbytes,
            "usage": dev.buffer_usage, "sharingMode": _vk.VK_SHARING_MODE_EXCLUSIVE})
        out = ffi.new("VkBuffer*")
        # VkResult vkCreateBuffer(VkDevice, const VkBufferCreateInfo*,
        #                         const VkAllocationCallbacks*, VkBuffer*)
        check(lib.vkCreateBuffer(dev.device, info, ffi.NULL, out), "vkCreateBuffer")
        handle = out[0]
        req = ffi.new("VkMemoryRequirements*")
        # void vkGetBufferMemoryRequirements(VkDevice, VkBuffer, VkMemoryRequirements*)
        lib.vkGetBufferMemoryRequirements(dev.device, handle, req)
        type_index = dev.mem_host if host else dev.mem_device
        if not (req.memoryTypeBits >> type_index) & 1:
            lib.vkDestroyBuffer(dev.device, handle, ffi.NULL)
            raise VulkanError(f"memory type {type_index} unusable for buffer {label}")
        align = max(int(req.alignment), dev.storage_align, 256)
        size = -(-int(req.size) // align) * align
        block, off = None, None
        for b in self.blocks:
            if b.type_index == type_index and b.host == host:
                off = b.take(size, align)
                if off is not None:
                    block = b
                    break
        if block is None and not host and self.pool is None:
            block = self._from_spare(type_index, size)
        if block is None and host and self.host_spare is not None \
                and self.host_spare.type_index == type_index and size <= self.host_spare.size:
            block, self.host_spare = self.host_spare, None
            self.blocks.append(block)
        if block is None and not host and self.pool is not None:
            try:
                block = self.pool.take(type_index, max(BLOCK_BYTES, size))
            except BaseException:
                lib.vkDestroyBuffer(dev.device, handle, ffi.NULL)
                raise
            self.blocks.append(block)
        if block is None:
            want = max(BLOCK_BYTES, size)
            while self.spare and not host and self.reserved_bytes() + want > self.spare_limit:
                self.spare.pop().close()        # smallest last: keep the big ones longest
            try:
                block = _Block(dev, type_index, want, host)
            except OutOfMemory:
                if not self.spare:
                    lib.vkDestroyBuffer(dev.device, handle, ffi.NULL)
                    raise
                self.trim()
                try:
                    block = _Block(dev, type_index, want, host)
                except OutOfMemory:
                    lib.vkDestroyBuffer(dev.device, handle, ffi.NULL)
                    raise
            self.blocks.append(block)
        if off is None:
            off = block.take(size, align)
        # VkResult vkBindBufferMemory(VkDevice, VkBuffer, VkDeviceMemory, VkDeviceSize)
        check(lib.vkBindBufferMemory(dev.device, handle, block.memory, off),
              "vkBindBufferMemory")
        buf = Buffer(label, kind, nbytes, host, handle, block, off, size)
        if block.mapped is not None:
            buf.view = block.mapped[off:off + nbytes]
        self.buffers.add(buf)
        return buf

    def free(self, buf: Buffer) -> None:
        """Release a buffer; its record stays valid with `released` true and no handle."""
        if buf.handle is None:
            return
        # void vkDestroyBuffer(VkDevice, VkBuffer, const VkAllocationCallbacks*)
        lib.vkDestroyBuffer(self.dev.device, buf.handle, ffi.NULL)
        buf.block.give(buf.offset, buf.alloc_bytes)
        if buf.block.used == 0 and buf.block.shared:
            self.blocks.remove(buf.block)
            self.pool.give(buf.block)
        elif buf.block.used == 0:
            self.blocks.remove(buf.block)
            if not buf.block.host and self.reserved_bytes() + buf.block.size \
                    <= self.spare_limit:
                self.spare.append(buf.block)
                self.spare.sort(key=lambda b: -b.size)
            elif buf.block.host and self.spare_limit and self.host_spare is None \
                    and buf.block.size == BLOCK_BYTES:
                self.host_spare = buf.block      # staging and KV shadows come and go
            else:
                buf.block.close()
        buf.handle, buf.block, buf.view = None, None, None
        self.buffers.discard(buf)

    def totals(self) -> dict[str, int]:
        """Live bytes by kind (released buffers are gone from the set, never dereferenced)."""
        out = {k: 0 for k in KINDS}
        for b in self.buffers:
            out[b.kind] += b.nbytes
        return out

    def _from_spare(self, type_index: int, size: int) -> _Block | None:
        """The smallest spare block that holds `size`, made live again."""
        fits = [b for b in self.spare if b.type_index == type_index and b.size >= size]
        if not fits:
            return None
        block = min(fits, key=lambda b: b.size)
        self.spare.remove(block)
        self.blocks.append(block)
        return block

    def reserved_bytes(self) -> int:
        """Device memory this allocator holds: live blocks and spares (host-memory blocks
        for shadows and staging are not counted: they are not VRAM)."""
        return sum(b.size for b in self.blocks if not b.host) + self.spare_bytes()

    def spare_bytes(self) -> int:
        return sum(b.size for b in self.spare)

    def trim(self, host: bool = True) -> int:
        """Free the spare device blocks, and with host the spare host block too; the device
        bytes given back. A hand-over to another process keeps the host block: it is no
        VRAM, and pinned host memory is slow to allocate (60-70 ms for a 256 MiB block on an
        H200's driver), and the next release's KV shadow goes there."""
        freed = self.spare_bytes()
        for b in self.spare:
            b.close()
        self.spare = []
        if host and self.host_spare is not None:
            self.host_spare.close()
            self.host_spare = None
        return freed

    def close(self) -> None:
        for b in list(self.buffers):
            self.free(b)
        for blk in self.blocks:
            if blk.shared:
                self.pool.give(blk)
            else:
                blk.close()
        self.blocks = []
        self.trim()
        if self.pool is not None:
            self.pool.close()
            self.pool = None


# -- host memory the device reads in place -------------------------------------------------

NVIDIA_VENDOR = 0x10DE
HOST_ALLOCATION = 0x00000080     # VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
IMPORT_CHUNK = 256 << 20


class HostImport:
    """Host pages (a file's memmap, a shadow) imported as device-readable buffers.

    With VK_EXT_external_memory_host the device copies from, or reads, those very pages: no
    staging copy and no second copy of the weights in RAM. The region is imported in
    page-aligned chunks no larger than the device's buffer limits; `spans(offset, n)` maps
    a byte range onto them. Pages the driver refuses (and the partial pages at either end)
    are simply not covered: the caller falls back to a one-time copy into a host-visible
    buffer for those ranges.
    """

    def __init__(self, dev: Device, region: np.ndarray, label: str,
                 chunk_bytes: int | None = None):
        self.dev, self.label = dev, label
        self.region = region                  # kept alive while imported
        self.chunks: list[tuple[int, int, Buffer]] = []   # (region offset, bytes, buffer)
        self.errors: list[str] = []
        align = dev.host_import_align
        if not align or region.nbytes < align:
            return
        base = int(ffi.cast("uintptr_t", ffi.from_buffer(region)))
        first = -(-base // align) * align - base
        end = (base + region.nbytes) // align * align - base
        limit = min(chunk_bytes or IMPORT_CHUNK, dev.max_storage_range, dev.max_allocation) // align * align
        get_props = _vk.vkGetDeviceProcAddr(dev.device, "vkGetMemoryHostPointerPropertiesEXT")
        for off in range(first, end, limit):
            n = min(limit, end - off)
            try:
                self.chunks.append((off, n, self._import(get_props, base + off, n,
                                                         f"{label}@{off}")))
            except VulkanError as exc:
                self.errors.append(str(exc))

    def _import(self, get_props, address: int, n: int, label: str) -> Buffer:
        dev = self.dev
        ptr = ffi.cast("void*", address)
        try:
            props = get_props(dev.device, HOST_ALLOCATION, ptr)
        except _vk.VkError as exc:
            raise VulkanError(f"{label}: host pointer refused ({type(exc).__name__})") from None
        bits = int(props.memoryTypeBits)
        if not bits:
            raise VulkanError(f"{label}: no memory type can import these pages")
        type_index = dev.mem_host if (bits >> dev.mem_host) & 1 else (bits & -bits).bit_length() - 1
        ext_info = ffi.new("VkExternalMemoryBufferCreateInfo*", {
            "sType": _vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
            "handleTypes": HOST_ALLOCATION})
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": _vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "pNext": ext_info, "size": n,
            "usage": BUFFER_USAGE, "sharingMode": _vk.VK_SHARING_MODE_EXCLUSIVE})
        out = ffi.new("VkBuffer*")
        check(lib.vkCreateBuffer(dev.device, info, ffi.NULL, out), "vkCreateBuffer")
        handle = out[0]
        imp = ffi.new("VkImportMemoryHostPointerInfoEXT*", {
            "sType": _vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
            "handleType": HOST_ALLOCATION, "pHostPointer": ptr})
        r, memory = _allocate_memory(dev, n, type_index, imp)
        if r != _vk.VK_SUCCESS:
            lib.vkDestroyBuffer(dev.device, handle, ffi.NULL)
            raise VulkanError(f"{label}: vkAllocateMemory of host pages failed ({r})")
        r = lib.vkBindBufferMemory(dev.device, handle, memory, 0)
        if r != _vk.VK_SUCCESS:
            lib.vkDestroyBuffer(dev.device, handle, ffi.NULL)
            lib.vkFreeMemory(dev.device, memory, ffi.NULL)
            raise VulkanError(f"{label}: vkBindBufferMemory of host pages failed ({r})")
        buf = Buffer(label, "pinned", n, True, handle, None, 0, n)
        buf.memory = memory
        return buf

    @property
    def nbytes(self) -> int:
        return sum(n for _, n, _ in self.chunks)

    def spans(self, offset: int, n: int) -> list[tuple[Buffer, int, int]] | None:
        """(buffer, offset in it, bytes) covering region[offset:offset + n] in order, or None
        when part of the range is not imported."""
        out, pos, end = [], offset, offset + n
        for start, size, buf in self.chunks:      # chunks are in region order
            if start + size <= pos:
                continue
            if start > pos:
                return None
            take = min(end, start + size) - pos
            out.append((buf, pos - start, take))
            pos += take
            if pos >= end:
                return out
        return None if pos < end else out

    def close(self) -> None:
        for _, _, buf in self.chunks:
            lib.vkDestroyBuffer(self.dev.device, buf.handle, ffi.NULL)
            lib.vkFreeMemory(self.dev.device, buf.memory, ffi.NULL)
            buf.handle = None
        self.chunks, self.region = [], None


# -- transfers ------------------------------------------------------------------------------

STAGING_BYTES = 32 << 20


class Uploader:
    """Batched host-to-device copies through two staging buffers.

    Mappable destinations (unified memory) are written directly. Otherwise bytes are packed
    into a staging buffer and copied by one command buffer per filled buffer; while the
    device copies one staging buffer the host fills the other.
    """

    def __init__(self, dev: Device, staging_bytes: int = STAGING_BYTES, direct: bool = True):
        self.dev, self.staging_bytes, self.direct = dev, staging_bytes, direct
        self._staging: list[Buffer] = []
        self._cmds: list = []
        self._pending: list[list] = [[], []]     # copies recorded per staging buffer
        self._fill = [0, 0]
        self._busy = [False, False]
        self._fences = []
        self._cur = 0
        self.bytes = 0

    def _ensure(self) -> None:
        if self._staging:
            return
        for i in range(2):
            self._staging.append(self.dev.allocator.alloc(self.staging_bytes, f"staging{i}",
                                                          "staging", host=True))
            self._cmds.append(allocate_command_buffer(self.dev))
            self._fences.append(_vk.vkCreateFence(self.dev.device, _vk.VkFenceCreateInfo(),
                                                  None))

    def _wait(self, i: int) -> None:
        if self._busy[i]:
            try:
                self.dev._wait_fences([self._fences[i]], "copy")
            except DeviceFault:
                self._drop()
                raise
            self._busy[i] = False

    def _drop(self) -> None:
        """After a fault (the device is idle again): forget the copies in flight and staged,
        and make both fences and command buffers fresh."""
        lib.vkResetFences(self.dev.device, len(self._fences), ffi.new("VkFence[]", self._fences))
        for cmd in self._cmds:
            lib.vkResetCommandBuffer(cmd, 0)
        self._busy, self._pending, self._fill = [False, False], [[], []], [0, 0]

    def _flush(self, i: int) -> None:
        copies = self._pending[i]
        if not copies:
            return
        cmd = self._cmds[i]
        begin(cmd, one_time=True)
        for dst, dst_off, src_off, n in copies:
            copy_buffer(cmd, self._staging[i], src_off, dst, dst_off, n)
        end(cmd)
        arr = ffi.new("VkCommandBuffer[1]", [cmd])
        info = ffi.new("VkSubmitInfo*", {"sType": _vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                         "commandBufferCount": 1, "pCommandBuffers": arr})
        self.dev.check_alive()
        with self.dev._lock:
            kind = _fire("copy")
            r = FAULT_RESULTS[kind] if kind is not None and kind != "timeout" \
                else lib.vkQueueSubmit(self.dev.queue, 1, info, self._fences[i])
            if r == _vk.VK_SUCCESS and kind == "timeout":    # queued, reported while running
                r = _vk.VK_TIMEOUT
            if r != _vk.VK_SUCCESS:
                err = self.dev._fault(r, "copy", [self._fences[i]], [cmd])
                self._drop()
                raise err
        self._busy[i] = True
        self._pending[i], self._fill[i] = [], 0

    def write(self, dst: Buffer, src: np.ndarray, offset: int = 0) -> None:
        self.dev.check_alive()
        src = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        self.bytes += src.nbytes
        if dst.view is not None and self.direct:
            dst.view[offset:offset + src.nbytes] = src
            return
        self._ensure()
        pos = 0
        while pos < src.nbytes:
            i = self._cur
            room = self.staging_bytes - self._fill[i]
            if room < min(4096, self.staging_bytes // 4) and self._pending[i]:
                self._flush(i)
                self._cur = i = 1 - i
                self._wait(i)
                room = self.staging_bytes
            n = min(room, src.nbytes - pos)
            start = self._fill[i]
            self._staging[i].view[start:start + n] = src[pos:pos + n]
            self._pending[i].append((dst, offset + pos, start, n))
            self._fill[i] += -(-n // 16) * 16
            pos += n

    def finish(self) -> None:
        """Submit what is staged and wait for every copy."""
        if self._staging:
            self._flush(self._cur)
            self._wait(0)
            self._wait(1)

    def close(self) -> None:
        try:
            if not self.dev.lost:
                self.finish()
        finally:
            self._release()

    def _release(self) -> None:
        for b in self._staging:
            self.dev.allocator.free(b)
        for f in self._fences:
            _vk.vkDestroyFence(self.dev.device, f, None)
        if self._cmds:
            _vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, len(self._cmds),
                                     self._cmds)
        self._staging, self._cmds, self._fences = [], [], []

    def __enter__(self) -> "Uploader":
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is None:
            self.close()
            return
        try:                             # what is staged is not sent; what is in flight ends
            if not self.dev.lost:
                self._pending = [[], []]
                self._wait(0)
                self._wait(1)
        finally:
            self._release()


class CopyStream:
    """Buffer-to-buffer copies submitted batch by batch without waiting, so that the host
    goes on (allocating the next destination, recording graphs) while the device copies;
    `wait()` waits for all of them. A restore uses it: weight arena i+1 is allocated while
    arena i is being filled.

    Each batch ends with a barrier that makes its writes visible to the shaders and copies
    queued after it, so work submitted later on the queue may read what it copied."""

    def __init__(self, dev: Device):
        self.dev = dev
        self._regions: list[tuple[Buffer, Buffer, list]] = []
        self._inflight: list[tuple[object, object]] = []     # (command buffer, fence)
        self.bytes = 0
        self.batches = 0

    def copy(self, src: Buffer, dst: Buffer, regions: list[tuple[int, int, int]]) -> None:
        """Queue (src offset, dst offset, bytes) copies for the next submit()."""
        if regions:
            self._regions.append((src, dst, regions))
            self.bytes += sum(r[2] for r in regions)

    def submit(self) -> None:
        """Send what is queued to the device now, one command buffer and fence."""
        if not self._regions:
            return
        dev = self.dev
        dev.check_alive()
        cmd = allocate_command_buffer(dev)
        fence = ffi.new("VkFence*")
        info = ffi.new("VkFenceCreateInfo*", {"sType": _vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
        # VkResult vkCreateFence(VkDevice, const VkFenceCreateInfo*, const VkAllocationCallbacks*,
        #                        VkFence*)
        check(lib.vkCreateFence(dev.device, info, ffi.NULL, fence), "vkCreateFence")
        self._inflight.append((cmd, fence[0]))
        begin(cmd, one_time=True)
        for src, dst, regions in self._regions:
            copy_regions(cmd, src, dst, regions)
        self._regions = []
        stages = _vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | _vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        barrier = ffi.new("VkMemoryBarrier*", {
            "sType": _vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": _vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": _vk.VK_ACCESS_SHADER_READ_BIT | _vk.VK_ACCESS_TRANSFER_READ_BIT})
        lib.vkCmdPipelineBarrier(cmd, _vk.VK_PIPELINE_STAGE_TRANSFER_BIT, stages, 0, 1, barrier,
                                 0, ffi.NULL, 0, ffi.NULL)
        end(cmd)
        arr = ffi.new("VkCommandBuffer[1]", [cmd])
        sub = ffi.new("VkSubmitInfo*", {"sType": _vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                        "commandBufferCount": 1, "pCommandBuffers": arr})
        with dev._lock:
            kind = _fire("copy")
            r = FAULT_RESULTS[kind] if kind is not None and kind != "timeout" \
                else lib.vkQueueSubmit(dev.queue, 1, sub, fence[0])
            if r == _vk.VK_SUCCESS and kind == "timeout":    # queued, reported while running
                r = _vk.VK_TIMEOUT
            if r != _vk.VK_SUCCESS:
                err = dev._fault(r, "copy", [f for _, f in self._inflight])
                self._release()
                raise err
        self.batches += 1

    def done(self) -> bool:
        """Whether every batch sent so far has finished (a look, not a wait)."""
        if not self._inflight:
            return True
        # VkResult vkGetFenceStatus(VkDevice, VkFence): VK_SUCCESS once signalled
        return lib.vkGetFenceStatus(self.dev.device, self._inflight[-1][1]) == _vk.VK_SUCCESS \
            and all(lib.vkGetFenceStatus(self.dev.device, f) == _vk.VK_SUCCESS
                    for _, f in self._inflight[:-1])

    def wait(self) -> None:
        """Submit what is queued and wait for every batch (DeviceFault if one failed)."""
        self.submit()
        try:
            if self._inflight:
                self.dev._wait_fences([f for _, f in self._inflight], "copy")
        finally:
            self._release()

    def _release(self) -> None:
        d = self.dev.device
        for cmd, fence in self._inflight:
            lib.vkDestroyFence(d, fence, ffi.NULL)
            _vk.vkFreeCommandBuffers(d, self.dev.command_pool, 1, [cmd])
        self._inflight, self._regions = [], []

    def close(self) -> None:
        """Wait for what is in flight (unless the device is lost) and free it."""
        try:
            if self._inflight and not self.dev.lost:
                self.dev._wait_fences([f for _, f in self._inflight], "copy")
        finally:
            self._release()


def upload(dev: Device, dst: Buffer, src: np.ndarray, offset: int = 0) -> None:
    """Copy host bytes into a buffer and wait (one-off transfers; use Uploader for many)."""
    with Uploader(dev) as up:
        up.write(dst, src, offset)


def download(dev: Device, src: Buffer, nbytes: int | None = None, offset: int = 0) -> np.ndarray:
    dev.check_alive()
    nbytes = src.nbytes - offset if nbytes is None else nbytes
    if src.view is not None:
        return src.view[offset:offset + nbytes].copy()
    staging = dev.allocator.alloc(nbytes, "readback", "staging", host=True)
    try:
        with dev.one_shot() as cmd:
            copy_buffer(cmd, src, offset, staging, 0, nbytes)
        return staging.view[:nbytes].copy()
    finally:
        dev.allocator.free(staging)


def download_many(dev: Device, sources: list[tuple[Buffer, int]]) -> list[np.ndarray]:
    """The first n bytes of each buffer, through one staging buffer and one submit."""
    dev.check_alive()
    if all(b.view is not None for b, _ in sources):
        return [b.view[:n].copy() for b, n in sources]
    total = sum(-(-n // 16) * 16 for _, n in sources)
    staging = dev.allocator.alloc(max(total, 16), "readback", "staging", host=True)
    try:
        offsets, off = [], 0
        with dev.one_shot() as cmd:
            for b, n in sources:
                offsets.append(off)
                if n:
                    copy_buffer(cmd, b, 0, staging, off, n)
                off += -(-n // 16) * 16
        return [staging.view[o:o + n].copy() for o, (_, n) in zip(offsets, sources)]
    finally:
        dev.allocator.free(staging)


def copy_regions(cmd, src: Buffer, dst: Buffer, regions: list[tuple[int, int, int]]) -> None:
    """Many (src offset, dst offset, bytes) copies between two buffers in one command."""
    if not regions:
        return
    arr = ffi.new("VkBufferCopy[]", [{"srcOffset": a, "dstOffset": b, "size": n}
                                     for a, b, n in regions])
    lib.vkCmdCopyBuffer(cmd, src.handle, dst.handle, len(regions), arr)


def copy_buffer(cmd, src: Buffer, src_off: int, dst: Buffer, dst_off: int, nbytes: int) -> None:
    region = ffi.new("VkBufferCopy*", {"srcOffset": src_off, "dstOffset": dst_off,
                                       "size": nbytes})
    # void vkCmdCopyBuffer(VkCommandBuffer, VkBuffer, VkBuffer, uint32_t, const VkBufferCopy*)
    lib.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1, region)


# -- kernels --------------------------------------------------------------------------------

class Kernel:
    """A compute pipeline: `n_buffers` storage buffers at bindings 0..n-1, a push block."""

    def __init__(self, dev: Device, name: str, spirv: bytes, n_buffers: int, push_size: int,
                 spec: dict[int, int] | None = None):
        self.dev, self.name, self.n_buffers, self.push_size = dev, name, n_buffers, push_size
        dev.check_alive()
        d = dev.device
        self.module = _vk.vkCreateShaderModule(d, _vk.VkShaderModuleCreateInfo(
            codeSize=len(spirv), pCode=spirv), None)
        bindings = [_vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=_vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=_vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(n_buffers)]
        self.set_layout = _vk.vkCreateDescriptorSetLayout(d, _vk.VkDescriptorSetLayoutCreateInfo(
            pBindings=bindings), None)
        ranges = [_vk.VkPushConstantRange(stageFlags=_vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                          size=push_size)] if push_size else None
        self.layout = _vk.vkCreatePipelineLayout(d, _vk.VkPipelineLayoutCreateInfo(
            pSetLayouts=[self.set_layout], pPushConstantRanges=ranges), None)
        spec = spec or {}
        spec_info = None
        if spec:
            ids = sorted(spec)
            data = struct.pack(f"<{len(ids)}I", *[spec[i] & 0xFFFFFFFF for i in ids])
            self._spec_data = ffi.new("char[]", data)
            entries = [_vk.VkSpecializationMapEntry(constantID=cid, offset=4 * k, size=4)
                       for k, cid in enumerate(ids)]
            spec_info = _vk.VkSpecializationInfo(pMapEntries=entries, dataSize=len(data),
                                                 pData=self._spec_data)
        stage = _vk.VkPipelineShaderStageCreateInfo(
            stage=_vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module, pName="main",
            pSpecializationInfo=spec_info)
        self.pipeline = _vk.vkCreateComputePipelines(
            d, dev.pipeline_cache, 1,
            [_vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)], None)[0]

    def close(self) -> None:
        d = self.dev.device
        _vk.vkDestroyPipeline(d, self.pipeline, None)
        _vk.vkDestroyPipelineLayout(d, self.layout, None)
        _vk.vkDestroyDescriptorSetLayout(d, self.set_layout, None)
        _vk.vkDestroyShaderModule(d, self.module, None)


class DescriptorArena:
    """Descriptor sets for one recorded graph; freed together."""

    def __init__(self, dev: Device, max_sets: int, max_buffers: int):
        self.dev = dev
        size = _vk.VkDescriptorPoolSize(type=_vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                        descriptorCount=max(max_buffers, 1))
        self.pool = _vk.vkCreateDescriptorPool(dev.device, _vk.VkDescriptorPoolCreateInfo(
            maxSets=max(max_sets, 1), pPoolSizes=[size]), None)

    def make_set(self, kernel: Kernel, buffers: list[tuple[Buffer, int, int]]):
        """buffers: (buffer, byte offset, byte range) for bindings 0..n-1."""
        # raw calls: a graph makes a set per op, and the wrappers' structs cost ~100 us a set
        # (most of a graph's recording time) against ~10 us
        d = self.dev.device
        layouts = ffi.new("VkDescriptorSetLayout[1]", [kernel.set_layout])
        info = ffi.new("VkDescriptorSetAllocateInfo*", {
            "sType": _vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
            "descriptorPool": self.pool, "descriptorSetCount": 1, "pSetLayouts": layouts})
        out = ffi.new("VkDescriptorSet[1]")
        # VkResult vkAllocateDescriptorSets(VkDevice, const VkDescriptorSetAllocateInfo*,
        #                                   VkDescriptorSet*)
        check(lib.vkAllocateDescriptorSets(d, info, out), "vkAllocateDescriptorSets")
        n = len(buffers)
        infos = ffi.new("VkDescriptorBufferInfo[]", [
            {"buffer": buf.handle, "offset": off, "range": rng} for buf, off, rng in buffers])
        writes = ffi.new("VkWriteDescriptorSet[]", [
            {"sType": _vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, "dstSet": out[0],
             "dstBinding": i, "descriptorCount": 1,
             "descriptorType": _vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
             "pBufferInfo": infos + i} for i in range(n)])
        # void vkUpdateDescriptorSets(VkDevice, uint32_t, const VkWriteDescriptorSet*,
        #                             uint32_t, const VkCopyDescriptorSet*)
        lib.vkUpdateDescriptorSets(d, n, writes, 0, ffi.NULL)
        return out[0]

    def close(self) -> None:
        _vk.vkDestroyDescriptorPool(self.dev.device, self.pool, None)


_BIND_COMPUTE = _vk.VK_PIPELINE_BIND_POINT_COMPUTE
_STAGE_COMPUTE = _vk.VK_SHADER_STAGE_COMPUTE_BIT


class CommandList:
    """A command buffer recorded once: dispatches with barriers where data flows."""

    def __init__(self, dev: Device):
        self.dev = dev
        dev.check_alive()
        self.cmd = allocate_command_buffer(dev)
        self._barrier = ffi.new("VkMemoryBarrier*", {
            "sType": _vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": _vk.VK_ACCESS_SHADER_WRITE_BIT | _vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": (_vk.VK_ACCESS_SHADER_READ_BIT | _vk.VK_ACCESS_SHADER_WRITE_BIT
                              | _vk.VK_ACCESS_INDIRECT_COMMAND_READ_BIT
                              | _vk.VK_ACCESS_TRANSFER_READ_BIT)})
        self._keep = []
        self.n_dispatches = 0
        begin(self.cmd)

    def barrier(self) -> None:
        stages = (_vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | _vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
        dst = stages | _vk.VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT
        # void vkCmdPipelineBarrier(VkCommandBuffer, srcStage, dstStage, deps,
        #     uint32_t, const VkMemoryBarrier*, uint32_t, ..., uint32_t, ...)
        lib.vkCmdPipelineBarrier(self.cmd, stages, dst, 0, 1, self._barrier, 0, ffi.NULL,
                                 0, ffi.NULL)

    def dispatch(self, kernel: Kernel, descriptor_set, push: bytes, groups: tuple[int, int, int],
                 indirect: tuple[Buffer, int] | None = None) -> None:
        cmd = self.cmd
        # void vkCmdBindPipeline(VkCommandBuffer, VkPipelineBindPoint, VkPipeline)
        lib.vkCmdBindPipeline(cmd, _BIND_COMPUTE, kernel.pipeline)
        sets = ffi.new("VkDescriptorSet[1]", [descriptor_set])
        self._keep.append(sets)
        # void vkCmdBindDescriptorSets(VkCommandBuffer, bindPoint, VkPipelineLayout, first,
        #     count, const VkDescriptorSet*, dynamicCount, const uint32_t*)
        lib.vkCmdBindDescriptorSets(cmd, _BIND_COMPUTE, kernel.layout, 0, 1, sets, 0, ffi.NULL)
        if kernel.push_size:
            data = ffi.new("char[]", push)
            self._keep.append(data)
            # void vkCmdPushConstants(VkCommandBuffer, VkPipelineLayout, stages, off, size, ptr)
            lib.vkCmdPushConstants(cmd, kernel.layout, _STAGE_COMPUTE, 0, len(push), data)
        if indirect is not None:
            buf, off = indirect
            # void vkCmdDispatchIndirect(VkCommandBuffer, VkBuffer, VkDeviceSize)
            lib.vkCmdDispatchIndirect(cmd, buf.handle, off)
        else:
            # void vkCmdDispatch(VkCommandBuffer, uint32_t, uint32_t, uint32_t)
            lib.vkCmdDispatch(cmd, *groups)
        self.n_dispatches += 1

    def copy(self, src: Buffer, src_off: int, dst: Buffer, dst_off: int, nbytes: int) -> None:
        copy_buffer(self.cmd, src, src_off, dst, dst_off, nbytes)

    def fill(self, dst: Buffer, value: int) -> None:
        """Every u32 of dst set to value."""
        # void vkCmdFillBuffer(VkCommandBuffer, VkBuffer, VkDeviceSize, VkDeviceSize, uint32_t)
        lib.vkCmdFillBuffer(self.cmd, dst.handle, 0, dst.nbytes, value)

    def timestamp(self, pool: "TimestampPool", index: int) -> None:
        # void vkCmdWriteTimestamp(VkCommandBuffer, VkPipelineStageFlagBits, VkQueryPool, uint32_t)
        lib.vkCmdWriteTimestamp(self.cmd, _vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                pool.pool, index)

    def reset_timestamps(self, pool: "TimestampPool") -> None:
        lib.vkCmdResetQueryPool(self.cmd, pool.pool, 0, pool.count)

    def finish(self) -> None:
        host_barrier(self.cmd)
        end(self.cmd)

    def close(self) -> None:
        _vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, 1, [self.cmd])
        self._keep = []


class TimestampPool:
    def __init__(self, dev: Device, count: int):
        self.dev, self.count = dev, count
        self.pool = _vk.vkCreateQueryPool(dev.device, _vk.VkQueryPoolCreateInfo(
            queryType=_vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=count), None)
        self._data = ffi.new("uint64_t[]", count)

    def read_ns(self, n: int | None = None) -> np.ndarray:
        n = self.count if n is None else n
        # VkResult vkGetQueryPoolResults(VkDevice, VkQueryPool, first, count, size_t, void*,
        #                                VkDeviceSize stride, VkQueryResultFlags)
        check(lib.vkGetQueryPoolResults(self.dev.device, self.pool, 0, n, 8 * n, self._data, 8,
                                        _vk.VK_QUERY_RESULT_64_BIT
                                        | _vk.VK_QUERY_RESULT_WAIT_BIT),
              "vkGetQueryPoolResults")
        ticks = np.frombuffer(ffi.buffer(self._data, 8 * n), dtype=np.uint64).astype(np.float64)
        return ticks * self.dev.timestamp_period_ns

    def close(self) -> None:
        _vk.vkDestroyQueryPool(self.dev.device, self.pool, None)
