//! MAC addresses as people write them: `02:00:00:00:00:01`.

use core::fmt;
use core::str::FromStr;

/// An Ethernet MAC address; reads and writes as six two-digit hexadecimal bytes separated by
/// colons (`02:00:00:00:00:01`, either case on the way in, lower case on the way out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address.
    pub const BROADCAST: MacAddr = MacAddr(crate::ether::BROADCAST);

    /// The six bytes.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// The address as one hexadecimal number (`0x020000000001`).
    pub fn hex(&self) -> String {
        let b = self.0;
        format!(
            "0x{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(b: [u8; 6]) -> MacAddr {
        MacAddr(b)
    }
}

impl From<MacAddr> for [u8; 6] {
    fn from(m: MacAddr) -> [u8; 6] {
        m.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// Text that is not a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a MAC address (six two-digit hex bytes with colons, as 02:00:00:00:00:01)")]
pub struct MacParseError(pub String);

impl FromStr for MacAddr {
    type Err = MacParseError;

    fn from_str(s: &str) -> Result<MacAddr, MacParseError> {
        let bad = || MacParseError(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let part = parts.next().ok_or_else(bad)?;
            // (`from_str_radix` alone would take a sign: `+f`.)
            if part.len() != 2 || !part.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *b = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn addresses_read_in_either_case_and_write_in_lower_case() {
        let m: MacAddr = "ff:FF:00:01:02:0a".parse().unwrap();
        assert_eq!(m, MacAddr([255, 255, 0, 1, 2, 10]));
        assert_eq!(m.to_string(), "ff:ff:00:01:02:0a");
        assert_eq!(m.hex(), "0xffff0001020a");
        assert_eq!(MacAddr::BROADCAST.to_string(), "ff:ff:ff:ff:ff:ff");
        assert_eq!(<[u8; 6]>::from(m), m.octets());
    }

    #[test]
    fn what_is_not_six_hex_bytes_is_refused() {
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:0g",
            "02:00:00:00:00:00:00",
            "02:00:00:00:00:",
            "2:0:0:0:0:1",
            "002:00:00:00:00:01",
            "+2:00:00:00:00:01",
            "02-00-00-00-00-01",
            " 02:00:00:00:00:01",
            "02:00:00:00:00:01\n",
            "02:00:00:00:00:é",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert_eq!(e, MacParseError(bad.to_string()));
            assert!(e.to_string().contains("is not a MAC address"), "{e}");
        }
    }

    proptest! {
        #[test]
        fn an_address_reads_back(b in any::<[u8; 6]>()) {
            let m = MacAddr(b);
            prop_assert_eq!(m.to_string().parse::<MacAddr>(), Ok(m));
            prop_assert_eq!(m.to_string().to_uppercase().parse::<MacAddr>(), Ok(m));
            prop_assert_eq!(u64::from_str_radix(&m.hex()[2..], 16).ok(),
                            Some(b.iter().fold(0u64, |a, x| a << 8 | u64::from(*x))));
        }

        #[test]
        fn any_text_is_an_address_or_an_error(s in "\\PC{0,24}") {
            if let Ok(m) = s.parse::<MacAddr>() {
                prop_assert_eq!(m.to_string(), s.to_lowercase());
            }
        }
    }
}
