//! Bringing a namespace's `lo` up (`ip link set lo up`, without netlink).

use std::ffi::CStr;
use std::io;
use std::os::fd::AsRawFd;

use crate::syscall_ret::check;

/// Sets IFF_UP on a network interface of the current netns (`ip link set lo up`, without
/// netlink).
pub fn interface_up(name: &CStr) -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.to_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: valid socket fd, request number matching the pointed-to ifreq.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } as libc::c_long)?;
    // SAFETY: reading the union member SIOCGIFFLAGS just filled in.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above, setting the flags.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) } as libc::c_long)?;
    Ok(())
}
