//! Which IP addresses are on the public internet: the rule that keeps tenants' webhooks from reaching inside the
//! network (loopback, private and shared ranges, link-local and cloud metadata, documentation and benchmarking
//! ranges, multicast, reserved space).
//!
//! The special-purpose ranges of each family come from the `ip_network` crate (the IANA registries); on top of it,
//! IPv4 multicast (which its `is_global` counts as routable) and IPv6 ranges it does not know are refused, and IPv6
//! forms that carry an IPv4 address (IPv4-mapped and -translated, NAT64's well-known prefix, 6to4 and Teredo) are
//! judged by the IPv4 addresses they carry: `64:ff9b::a9fe:a9fe` is the metadata service at `169.254.169.254`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ip_network::{Ipv4Network, Ipv6Network};

/// Whether `ip` is a globally routable unicast address, and so are the IPv4 addresses it carries.
pub fn is_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_global(v4),
        IpAddr::V6(v6) => v6_global(v6),
    }
}

/// The IPv4 addresses an IPv6 address carries, for the forms that deliver to them: IPv4-mapped (`::ffff:0:0/96`),
/// IPv4-translated (`::ffff:0:0:0/96`), IPv4-compatible (`::/96`, deprecated), NAT64's well-known prefix
/// (`64:ff9b::/96`), 6to4 (`2002::/16`) and Teredo (`2001::/32`: its server and, bits inverted, its client).
pub fn embedded_ipv4(ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0xffff, 0, hi, lo] | [0, 0, 0, 0, 0, 0, hi, lo] => {
            vec![v4(hi, lo)]
        }
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => vec![v4(hi, lo)],
        [0x2002, hi, lo, ..] => vec![v4(hi, lo)],
        [0x2001, 0, shi, slo, _, _, chi, clo] => vec![v4(shi, slo), v4(!chi, !clo)],
        _ => Vec::new(),
    }
}

fn v4_global(ip: Ipv4Addr) -> bool {
    Ipv4Network::from(ip).is_global() && !ip.is_multicast()
}

fn v6_global(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let carried = embedded_ipv4(ip);
    if !carried.is_empty() {
        // IPv4-compatible addresses are deprecated and routed nowhere; the other forms deliver to what they carry.
        let compatible = s[..6] == [0; 6];
        return !compatible && carried.into_iter().all(v4_global);
    }
    let net = Ipv6Network::from(ip);
    net.is_unicast_global()
        // NAT64 local-use prefix: where its IPv4 address sits is the operator's choice, and it is not routed.
        && !(s[0] == 0x64 && s[1] == 0xff9b)
        // Discard-only (`100::/64`).
        && !(s[0] == 0x100 && s[1..4] == [0, 0, 0])
        // IETF protocol assignments (`2001::/23`; Teredo, the one form of it that delivers, is handled above).
        && !(s[0] == 0x2001 && s[1] < 0x200)
        // Documentation (`3fff::/20`) and segment routing (`5f00::/16`).
        && !(s[0] & 0xfff0 == 0x3ff0 || s[0] == 0x5f00)
        // Anything outside global unicast (`2000::/3`) is reserved or special.
        && s[0] & 0xe000 == 0x2000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(ip: &str) -> bool {
        is_global(ip.parse().expect("ip"))
    }

    #[test]
    fn internal_and_special_addresses_are_not_global() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "198.18.0.1",
            "198.19.255.255",
            "192.0.0.1",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "240.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "ff0e::1",
            "2001:db8::1",
            "3fff::1",
            "100::1",
            "2001:2::1",
            "5f00::1",
            // IPv6 forms that carry an internal IPv4 address.
            "::ffff:10.0.0.1",
            "::ffff:0:127.0.0.1",
            "::127.0.0.1",
            "::8.8.8.8",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::a00:1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::808:808",
            "2002:a9fe:a9fe::1",
            "2002:c0a8:101::1",
            "2002:7f00:1::",
            // Teredo: server 65.54.227.120 with client 10.0.0.1 (bits inverted), then an internal server.
            "2001:0:4136:e378:8000:63bf:f5ff:fffe",
            "2001:0:a00:1:8000:63bf:f7f7:f7f7",
        ] {
            assert!(!global(ip), "{ip}");
        }
    }

    #[test]
    fn internet_addresses_are_global_and_so_are_forms_that_carry_one() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "198.20.0.1",
            "2001:4860:4860::8888",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::808:808",
            "2002:808:808::1",
            // Teredo: server 65.54.227.120, client 8.8.8.8 (bits inverted).
            "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
        ] {
            assert!(global(ip), "{ip}");
        }
    }

    #[test]
    fn carried_ipv4_addresses_are_decoded() {
        let v4 = |ip: &str| embedded_ipv4(ip.parse().expect("ip"));
        assert_eq!(v4("64:ff9b::a9fe:a9fe"), [Ipv4Addr::new(169, 254, 169, 254)]);
        assert_eq!(v4("2002:a00:1::"), [Ipv4Addr::new(10, 0, 0, 1)]);
        assert_eq!(
            v4("2001:0:4136:e378:8000:63bf:f5ff:fffe"),
            [Ipv4Addr::new(65, 54, 227, 120), Ipv4Addr::new(10, 0, 0, 1)]
        );
        assert!(v4("2001:4860::1").is_empty());
    }
}
