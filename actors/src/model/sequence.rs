//! Kinesis sequence numbers.
//!
//! The Kinesis API types a sequence number as a decimal string matching
//! `0|([1-9]\d{0,128})`. Real ones are 56 digits today (about 186 bits), so they do
//! not fit in a `u128`: we keep the digits and compare by length, then by digit,
//! which is numeric order for canonical decimals. Comparing the raw strings would put
//! `"9"` after `"10"`.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Longest sequence number the Kinesis API accepts, in digits.
pub const MAX_DIGITS: usize = 129;

/// A Kinesis sequence number: ordered numerically, printed as it was given.
///
/// ```
/// use flotilla_actors::model::SequenceNumber;
///
/// let a: SequenceNumber = "9".parse()?;
/// let b: SequenceNumber = "10".parse()?;
/// assert!(a < b); // as strings, "9" > "10"
/// let real: SequenceNumber = "49680458031169431967754064162084943116060673600470908946".parse()?;
/// assert!(real > b && real.to_u128().is_none()); // 56 digits: wider than 128 bits
/// assert!("12ab".parse::<SequenceNumber>().is_err());
/// # Ok::<(), flotilla_actors::model::SequenceNumberError>(())
/// ```
#[derive(Clone, Eq)]
pub struct SequenceNumber {
    /// The text as received (returned unchanged to Kinesis and DynamoDB).
    original: Box<str>,
    /// Byte offset of the first significant digit in `original` (leading zeros skipped).
    significant: u8,
}

/// Why a text is not a sequence number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceNumberError {
    /// The text is empty.
    #[error("sequence number is empty")]
    Empty,
    /// The text holds something other than ASCII digits (a sign, a space, a letter).
    #[error("sequence number {text:?} has a non-digit {found:?} at byte {at}")]
    NotDecimal {
        /// The text that was read.
        text: String,
        /// The first character that is not a digit.
        found: char,
        /// Its byte offset in `text`.
        at: usize,
    },
    /// More than [`MAX_DIGITS`] significant digits.
    #[error(
        "sequence number {text:?} has {digits} significant digits; Kinesis allows at most {MAX_DIGITS}"
    )]
    TooLong {
        /// The text that was read.
        text: String,
        /// How many significant digits it has (leading zeros not counted).
        digits: usize,
    },
    /// More than 255 leading zeros: padding no server sends, and more than the parsed
    /// form keeps track of.
    #[error("sequence number {text:?} has {zeros} leading zeros; at most 255 are accepted")]
    TooManyLeadingZeros {
        /// The text that was read.
        text: String,
        /// How many leading zeros it has.
        zeros: usize,
    },
}

impl SequenceNumber {
    /// Parses a decimal sequence number. Leading zeros are accepted (and ignored when
    /// comparing) because some emulators pad; signs, spaces and other characters are not.
    pub fn parse(text: &str) -> Result<Self, SequenceNumberError> {
        if text.is_empty() {
            return Err(SequenceNumberError::Empty);
        }
        if let Some((at, found)) = text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
            return Err(SequenceNumberError::NotDecimal {
                text: text.to_owned(),
                found,
                at,
            });
        }
        let zeros = text.bytes().take_while(|b| *b == b'0').count();
        // "000" is zero: keep one digit as the significant part.
        let significant = zeros.min(text.len() - 1);
        let digits = text.len() - significant;
        if digits > MAX_DIGITS {
            return Err(SequenceNumberError::TooLong {
                text: text.to_owned(),
                digits,
            });
        }
        if significant > usize::from(u8::MAX) {
            return Err(SequenceNumberError::TooManyLeadingZeros {
                text: text.to_owned(),
                zeros: significant,
            });
        }
        Ok(Self {
            original: text.into(),
            significant: significant as u8,
        })
    }

    /// Builds a sequence number from an integer (used by the in-memory stream).
    pub fn from_u128(value: u128) -> Self {
        Self {
            original: value.to_string().into_boxed_str(),
            significant: 0,
        }
    }

    /// The text exactly as it was parsed.
    pub fn as_str(&self) -> &str {
        &self.original
    }

    /// The digits without leading zeros: the canonical form used for ordering.
    fn digits(&self) -> &str {
        &self.original[usize::from(self.significant)..]
    }

    /// The value as an integer, when it fits in 128 bits.
    pub fn to_u128(&self) -> Option<u128> {
        self.digits().parse().ok()
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.digits(), other.digits());
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Equality is numeric, like the ordering: `"007"` equals `"7"`.
impl PartialEq for SequenceNumber {
    fn eq(&self, other: &Self) -> bool {
        self.digits() == other.digits()
    }
}

impl std::hash::Hash for SequenceNumber {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digits().hash(state);
    }
}

impl FromStr for SequenceNumber {
    type Err = SequenceNumberError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.original)
    }
}

impl fmt::Debug for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SequenceNumber({})", self.original)
    }
}

impl serde::Serialize for SequenceNumber {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.original)
    }
}

impl<'de> serde::Deserialize<'de> for SequenceNumber {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seq(text: &str) -> SequenceNumber {
        SequenceNumber::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn orders_numerically_not_lexically() {
        let table = [
            ("9", "10", Ordering::Less),
            ("10", "9", Ordering::Greater),
            ("0", "0", Ordering::Equal),
            ("007", "7", Ordering::Equal),
            ("0010", "9", Ordering::Greater),
            (
                "49680458031169431967754064162084943116060673600470908946",
                "49680458031169431967754064162084943116060673600470908947",
                Ordering::Less,
            ),
            (
                "49680458031169431967754064162084943116060673600470908946",
                "340282366920938463463374607431768211455",
                Ordering::Greater,
            ),
        ];
        for (a, b, want) in table {
            assert_eq!(seq(a).cmp(&seq(b)), want, "{a} vs {b}");
        }
    }

    #[test]
    fn keeps_the_original_text() {
        assert_eq!(seq("0042").as_str(), "0042");
        assert_eq!(seq("0042").to_string(), "0042");
        assert_eq!(seq("0042").to_u128(), Some(42));
        assert_eq!(seq(&"9".repeat(56)).to_u128(), None);
    }

    #[test]
    fn rejects_garbage_with_a_clear_error() {
        let table: [(&str, &str); 6] = [
            ("", "sequence number is empty"),
            ("12a4", "non-digit 'a' at byte 2"),
            ("-1", "non-digit '-' at byte 0"),
            (" 1", "non-digit ' ' at byte 0"),
            ("1.5", "non-digit '.' at byte 1"),
            ("SHARD_END", "non-digit 'S' at byte 0"),
        ];
        for (text, want) in table {
            let err = SequenceNumber::parse(text).expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let long = "1".repeat(MAX_DIGITS + 1);
        let err = SequenceNumber::parse(&long)
            .expect_err("too long")
            .to_string();
        assert!(err.contains("130 significant digits"), "{err}");
        assert!(SequenceNumber::parse(&"9".repeat(MAX_DIGITS)).is_ok());
        let padded = format!("{}7", "0".repeat(256));
        let err = SequenceNumber::parse(&padded)
            .expect_err("too much padding")
            .to_string();
        assert!(err.contains("256 leading zeros"), "{err}");
        assert!(SequenceNumber::parse(&format!("{}7", "0".repeat(255))).is_ok());
    }

    proptest! {
        #[test]
        fn order_matches_u128_order(a: u128, b: u128) {
            prop_assert_eq!(SequenceNumber::from_u128(a).cmp(&SequenceNumber::from_u128(b)), a.cmp(&b));
        }

        #[test]
        fn leading_zeros_do_not_change_the_value(a: u128, zeros in 0usize..20) {
            let padded = format!("{}{}", "0".repeat(zeros), a);
            prop_assert_eq!(seq(&padded), SequenceNumber::from_u128(a));
        }

        #[test]
        fn long_numbers_order_like_their_digit_strings(a in "[1-9][0-9]{0,80}", b in "[1-9][0-9]{0,80}") {
            let want = a.len().cmp(&b.len()).then_with(|| a.cmp(&b));
            prop_assert_eq!(seq(&a).cmp(&seq(&b)), want);
        }
    }
}
