//! Sizes as Kubernetes writes quantities (`5Gi`, `512Mi`, `1G`, `4096`), parsed once where they
//! enter (config load, a request) and carried as [`ByteSize`] from there on.

use std::fmt;
use std::str::FromStr;

/// A byte count with the text it was written as (`5Gi`), which records and listings keep.
/// Two sizes are equal when their byte counts are (`5Gi` == `5120Mi`).
#[derive(Debug, Clone, Eq)]
pub struct ByteSize {
    bytes: u64,
    text: String,
}

/// A text that is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a size like 5Gi, 512Mi or 1G")]
pub struct NotASize(pub String);

impl ByteSize {
    /// Parses a quantity; `0` is a size (of nothing), a negative or unitless-garbage one is not.
    pub fn parse(s: &str) -> Result<Self, NotASize> {
        let t = s.trim();
        if t == "0" {
            return Ok(Self::zero());
        }
        parse_size(t)
            .map(|bytes| Self {
                bytes,
                text: t.to_string(),
            })
            .ok_or_else(|| NotASize(s.to_string()))
    }

    /// The size of nothing.
    pub fn zero() -> Self {
        Self {
            bytes: 0,
            text: "0".into(),
        }
    }

    /// The byte count.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The text it was written as.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for ByteSize {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for ByteSize {
    type Err = NotASize;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Parses a Kubernetes quantity such as `5Gi`, `512Mi`, `1G` or `1000` into bytes; zero and
/// anything else is None.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult).filter(|v| *v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        for (s, v) in [
            ("5Gi", Some(5u64 << 30)),
            ("512Mi", Some(512 << 20)),
            ("1G", Some(1_000_000_000)),
            ("4096", Some(4096)),
            ("0", None),
            ("", None),
            ("5GB", None),
            ("-1Gi", None),
            ("Gi", None),
            ("99999999999999999999Ti", None),
        ] {
            assert_eq!(parse_size(s), v, "{s}");
        }
    }

    #[test]
    fn byte_sizes_keep_their_text_and_compare_by_bytes() {
        let a = ByteSize::parse(" 5Gi ").unwrap();
        assert_eq!((a.bytes(), a.as_str()), (5 << 30, "5Gi"));
        assert_eq!(a, ByteSize::parse("5120Mi").unwrap());
        assert_ne!(a, ByteSize::parse("5G").unwrap());
        assert_eq!(ByteSize::parse("0").unwrap().bytes(), 0);
        assert!(ByteSize::parse("lots").is_err());
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"5Gi\"");
        let back: ByteSize = serde_json::from_str(&json).unwrap();
        assert_eq!(back.as_str(), "5Gi");
        assert!(serde_json::from_str::<ByteSize>("\"5GB\"").is_err());
    }
}
