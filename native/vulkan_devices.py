"""The Vulkan physical devices a loader offers, read through its C API with ctypes: what Dawn's Vulkan
backend will see (harness.native.webgpu_ep). Only the leading fields of each struct are read; every
buffer is sized past the struct it stands for."""

from __future__ import annotations

import ctypes
from typing import Any

MAX_DEVICES = 16
PROPERTIES_BYTES = 4096  # VkPhysicalDeviceProperties is 824 bytes
API_1_2 = (1 << 22) | (2 << 12)
# VkStructureType values
APPLICATION_INFO, INSTANCE_CREATE_INFO = 0, 1
PROPERTIES_2, DRIVER_PROPERTIES = 1000059001, 1000196000
FEATURES_2, FLOAT16_INT8_FEATURES, STORAGE_16BIT_FEATURES = 1000059000, 1000082000, 1000083000
DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]  # fmt: skip


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.c_void_p), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]  # fmt: skip


def _chained(s_type: int, size: int, next_buffer: Any = None) -> Any:
    """A zeroed Vulkan output struct: sType at 0, pNext at 8."""
    buffer = ctypes.create_string_buffer(size)
    ctypes.c_uint32.from_buffer(buffer, 0).value = s_type
    if next_buffer is not None:
        ctypes.c_void_p.from_buffer(buffer, 8).value = ctypes.addressof(next_buffer)
    return buffer


def _text(buffer: Any, offset: int, size: int = 256) -> str:
    raw = bytes(buffer[offset : offset + size]).split(b"\0", 1)[0]
    return raw.decode("utf-8", "replace")[:200]


def _u32(buffer: Any, offset: int) -> int:
    return ctypes.c_uint32.from_buffer(buffer, offset).value


def _instance(vk: Any) -> tuple[ctypes.c_void_p, bool]:
    """An instance asking for Vulkan 1.2 (driver properties), or 1.0 where the loader refuses that."""
    for api in (API_1_2, None):
        app = _AppInfo(APPLICATION_INFO, None, b"accelharness", 1, b"accelharness", 1, api or 0)
        info = _InstanceInfo(INSTANCE_CREATE_INFO, None, 0, ctypes.addressof(app) if api else None, 0, None, 0, None)
        instance = ctypes.c_void_p()
        if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) == 0:
            return instance, api is not None
    raise RuntimeError("vkCreateInstance failed: the loader found no ICD it could use")


def physical_devices(loader: str) -> list[dict[str, Any]]:
    """Every physical device the loader offers: ids, type, name, driver and the f16 features Dawn needs."""
    vk = ctypes.CDLL(loader)
    instance, api_1_2 = _instance(vk)
    try:
        count = ctypes.c_uint32(MAX_DEVICES)
        handles = (ctypes.c_void_p * MAX_DEVICES)()
        status = vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        if status not in (0, 5):  # VK_SUCCESS, VK_INCOMPLETE (more than MAX_DEVICES: the first ones)
            raise RuntimeError(f"vkEnumeratePhysicalDevices returned {status}")
        return [_device(vk, ctypes.c_void_p(handles[i]), api_1_2) for i in range(count.value)]
    finally:
        vk.vkDestroyInstance(instance, None)


def _device(vk: Any, handle: ctypes.c_void_p, api_1_2: bool) -> dict[str, Any]:
    properties = ctypes.create_string_buffer(PROPERTIES_BYTES)
    vk.vkGetPhysicalDeviceProperties(handle, properties)
    api = _u32(properties, 0)
    device = {"vendor_id": _u32(properties, 8), "device_id": _u32(properties, 12),
              "type": DEVICE_TYPES.get(_u32(properties, 16), "other"), "device_name": _text(properties, 20),
              "vulkan_api": f"{api >> 22}.{(api >> 12) & 0x3FF}.{api & 0xFFF}"}  # fmt: skip
    if api_1_2 and (api >> 12) >= (1 << 10) | 2:  # the device offers 1.2: driver properties, f16 features
        driver = _chained(DRIVER_PROPERTIES, 1024)
        vk.vkGetPhysicalDeviceProperties2(handle, _chained(PROPERTIES_2, PROPERTIES_BYTES, driver))
        device |= {"driver_name": _text(driver, 20), "driver_info": _text(driver, 276)}
        f16, storage = _chained(FLOAT16_INT8_FEATURES, 256), _chained(STORAGE_16BIT_FEATURES, 256)
        ctypes.c_void_p.from_buffer(f16, 8).value = ctypes.addressof(storage)
        vk.vkGetPhysicalDeviceFeatures2(handle, _chained(FEATURES_2, 1024, f16))
        # Dawn's Vulkan backend offers shader-f16 when these four features are all there
        device["shader_f16"] = all(_u32(b, o) == 1 for b, o in ((f16, 16), (storage, 16), (storage, 20), (storage, 28)))
    return device
