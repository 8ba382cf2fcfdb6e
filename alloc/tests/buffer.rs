//! `Buffer` and `DeviceAllocator`: dropping frees (seen in the allocator's stats), unowned
//! memory is never freed, copies pick their direction from the devices, misuse is an error.

// Tests of the crate that holds allocview's unsafe code exercise it directly.
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::cpu::CpuAllocator;
use allocview_alloc::device::{
    Buffer, CpuDeviceAllocator, DeviceAllocator, DeviceMemoryError, DeviceType, MemcpyKind,
};
use allocview_alloc::stats::AllocatorStats;

/// A stand-in device (`cuda:n`) whose memory is host memory, recording each copy it performs.
struct FakeDevice {
    index: i32,
    host: CpuDeviceAllocator,
    copies: Mutex<Vec<(MemcpyKind, usize, Option<StreamId>)>>,
}

impl FakeDevice {
    fn new(index: i32) -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            index,
            host: CpuDeviceAllocator::new(),
            copies: Mutex::default(),
        })
    }
    fn copies(&self) -> Vec<(MemcpyKind, usize, Option<StreamId>)> {
        self.copies.lock().unwrap().clone()
    }
}

impl DeviceAllocator for FakeDevice {
    fn device_type(&self) -> DeviceType {
        DeviceType::Cuda(self.index)
    }
    fn allocate(&self, size: usize) -> Result<NonNull<u8>, DeviceMemoryError> {
        self.host.allocate(size)
    }
    unsafe fn release(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded; our pointers come from `self.host`.
        unsafe { self.host.release(ptr) }
    }
    unsafe fn memcpy(
        &self,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        n: usize,
        kind: MemcpyKind,
        stream: Option<StreamId>,
        sync: bool,
    ) -> Result<(), DeviceMemoryError> {
        self.copies.lock().unwrap().push((kind, n, stream));
        // SAFETY: the "device" memory is host memory; the caller guarantees both ranges.
        unsafe {
            self.host
                .memcpy(dst, src, n, MemcpyKind::HostToHost, stream, sync)
        }
    }
    unsafe fn memset_zero(
        &self,
        ptr: NonNull<u8>,
        n: usize,
        stream: Option<StreamId>,
        sync: bool,
    ) -> Result<(), DeviceMemoryError> {
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.host.memset_zero(ptr, n, stream, sync) }
    }
    fn stats(&self) -> Option<AllocatorStats> {
        self.host.stats()
    }
}

fn in_use(a: &dyn DeviceAllocator) -> u64 {
    a.stats().unwrap().bytes_in_use
}

#[test]
fn dropping_an_owned_buffer_frees_its_memory() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let buffer = Buffer::new(cpu.clone(), 4096).unwrap();
    assert!(buffer.is_owned());
    assert_eq!(buffer.device(), DeviceType::Cpu);
    assert_eq!(buffer.len(), 4096);
    assert_eq!(in_use(&*cpu), 4096);
    let second = Buffer::new(cpu.clone(), 100).unwrap();
    assert_eq!(in_use(&*cpu), 4196);
    drop(buffer);
    assert_eq!(in_use(&*cpu), 100);
    drop(second);
    assert_eq!(in_use(&*cpu), 0);
    assert_eq!(cpu.stats().unwrap().num_allocs, 2);
}

#[test]
fn a_buffer_moved_to_another_thread_frees_there_once() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let buffer = Buffer::new(cpu.clone(), 64).unwrap();
    std::thread::spawn(move || drop(buffer)).join().unwrap();
    assert_eq!(in_use(&*cpu), 0);
}

#[test]
fn an_unowned_buffer_never_frees_the_memory_it_wraps() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let owner = Buffer::new(cpu.clone(), 256).unwrap();
    {
        // SAFETY: `owner` outlives the view and nothing else touches the memory meanwhile.
        let mut view = unsafe { Buffer::wrap_unowned(owner.as_ptr(), 256, cpu.clone()) };
        assert!(!view.is_owned());
        view.as_mut_slice().unwrap().fill(9);
    }
    assert_eq!(in_use(&*cpu), 256, "dropping the view freed nothing");
    assert!(owner.as_slice().unwrap().iter().all(|&b| b == 9));
    drop(owner);
    assert_eq!(in_use(&*cpu), 0);
}

#[test]
fn an_unowned_buffer_can_wrap_a_callers_array() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let mut array = [1u8, 2, 3, 4];
    let ptr = NonNull::new(array.as_mut_ptr()).unwrap();
    // SAFETY: `array` outlives `view`, which is the only user while it lives.
    let view = unsafe { Buffer::wrap_unowned(ptr, 4, cpu.clone()) };
    let mut copy = Buffer::new(cpu.clone(), 4).unwrap();
    copy.copy_from(&view).unwrap();
    drop(view);
    assert_eq!(copy.as_slice().unwrap(), &[1, 2, 3, 4]);
    assert_eq!(in_use(&*cpu), 4);
}

#[test]
fn copies_pick_their_direction_from_the_two_devices() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let gpu = FakeDevice::new(0);
    let mut host_a = Buffer::new(cpu.clone(), 8).unwrap();
    host_a.as_mut_slice().unwrap().copy_from_slice(b"allocvie");
    let mut host_b = Buffer::new(cpu.clone(), 8).unwrap();
    let mut dev_a = Buffer::new(gpu.clone(), 8).unwrap();
    let mut dev_b = Buffer::new(gpu.clone(), 8).unwrap();
    assert_eq!(dev_a.device(), DeviceType::Cuda(0));

    dev_a.copy_from(&host_a).unwrap();
    dev_b.copy_from(&dev_a).unwrap();
    host_b.copy_from(&dev_b).unwrap();
    host_a.copy_from(&host_b).unwrap(); // the CPU allocator does this one
    let kinds: Vec<MemcpyKind> = gpu.copies().iter().map(|c| c.0).collect();
    assert_eq!(
        kinds,
        [
            MemcpyKind::HostToDevice,
            MemcpyKind::DeviceToDevice,
            MemcpyKind::DeviceToHost
        ]
    );
    assert_eq!(host_b.as_slice().unwrap(), b"allocvie");
    assert_eq!(
        MemcpyKind::between(DeviceType::Cpu, DeviceType::Cpu),
        MemcpyKind::HostToHost
    );
    assert_eq!(
        MemcpyKind::between(DeviceType::Cuda(1), DeviceType::Cuda(0)),
        MemcpyKind::DeviceToDevice
    );
}

#[test]
fn range_copies_pass_their_stream_and_land_at_the_offsets() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let gpu = FakeDevice::new(1);
    let mut src = Buffer::new(cpu.clone(), 10).unwrap();
    src.as_mut_slice().unwrap().copy_from_slice(b"0123456789");
    let mut dev = Buffer::new(gpu.clone(), 4).unwrap();
    dev.copy_range_from(1, &src, 6, 3, Some(StreamId(7)), false)
        .unwrap();
    assert_eq!(
        gpu.copies(),
        [(MemcpyKind::HostToDevice, 3, Some(StreamId(7)))]
    );
    let mut back = Buffer::new(cpu, 4).unwrap();
    back.zero().unwrap();
    back.copy_range_from(0, &dev, 1, 3, None, true).unwrap();
    assert_eq!(back.as_slice().unwrap(), b"678\0");
}

#[test]
fn copying_past_the_end_is_an_error_and_copies_nothing() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let src = Buffer::new(cpu.clone(), 16).unwrap();
    let mut dst = Buffer::new(cpu.clone(), 8).unwrap();
    dst.as_mut_slice().unwrap().fill(1);
    assert_eq!(
        dst.copy_range_from(4, &src, 0, 5, None, true),
        Err(DeviceMemoryError::OutOfBounds {
            offset: 4,
            len: 5,
            capacity: 8
        })
    );
    assert_eq!(
        dst.copy_range_from(0, &src, 12, 8, None, true),
        Err(DeviceMemoryError::OutOfBounds {
            offset: 12,
            len: 8,
            capacity: 16
        })
    );
    assert!(matches!(
        dst.copy_range_from(usize::MAX, &src, 0, 2, None, true),
        Err(DeviceMemoryError::OutOfBounds { .. })
    ));
    assert!(dst.as_slice().unwrap().iter().all(|&b| b == 1));
}

#[test]
fn whole_buffer_copies_between_different_sizes_are_errors() {
    let cpu = Arc::new(CpuDeviceAllocator::new());
    let src = Buffer::new(cpu.clone(), 16).unwrap();
    let mut dst = Buffer::new(cpu.clone(), 8).unwrap();
    assert_eq!(
        dst.copy_from(&src),
        Err(DeviceMemoryError::SizeMismatch { dst: 8, src: 16 })
    );
}

#[test]
fn device_memory_is_not_host_accessible() {
    let gpu = FakeDevice::new(0);
    let mut dev = Buffer::new(gpu, 8).unwrap();
    assert_eq!(
        dev.as_slice().unwrap_err(),
        DeviceMemoryError::NotHost(DeviceType::Cuda(0))
    );
    assert!(dev.as_mut_slice().is_err());
    dev.zero().unwrap();
}

#[test]
fn the_cpu_allocator_refuses_device_directions() {
    let cpu = CpuDeviceAllocator::new();
    let a = cpu.allocate(8).unwrap();
    let b = cpu.allocate(8).unwrap();
    // SAFETY: both are live 8-byte host allocations of `cpu`.
    let err = unsafe { cpu.memcpy(a, b, 8, MemcpyKind::HostToDevice, None, true) };
    assert_eq!(
        err,
        Err(DeviceMemoryError::UnsupportedCopy {
            kind: MemcpyKind::HostToDevice,
            device: DeviceType::Cpu
        })
    );
    // SAFETY: allocated above, released once.
    unsafe {
        cpu.release(a);
        cpu.release(b);
    }
}

#[test]
fn allocation_failures_are_errors_not_null_buffers() {
    let cpu = Arc::new(CpuDeviceAllocator::from_cpu(CpuAllocator::with_limit(100)));
    let kept = Buffer::new(cpu.clone(), 100).unwrap();
    let err = Buffer::new(cpu.clone(), 1).unwrap_err();
    assert!(matches!(err, DeviceMemoryError::Alloc(_)));
    assert!(err.to_string().contains("limit"));
    drop(kept);
    let empty = Buffer::new(cpu.clone(), 0).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.as_slice().unwrap(), &[] as &[u8]);
    drop(empty);
    assert_eq!(in_use(&*cpu), 0);
    assert_eq!(DeviceType::Cuda(3).to_string(), "cuda:3");
}
