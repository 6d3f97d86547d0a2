//! How long an upstream asked us to wait: `retry-after-ms`, `retry-after` (seconds or
//! HTTP-date), and on a 429 the providers' rate-limit reset headers (OpenAI's Go-style
//! durations, Anthropic's RFC 3339 timestamps).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// The wait the upstream asked for, if it said. `rate_limited` enables the reset headers,
/// which every response carries and which only mean "wait" on a 429.
pub fn retry_after(headers: &HeaderMap, rate_limited: bool) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now(), rate_limited)
}

/// How long the upstream asked us to wait. `retry-after-ms` wins, then `retry-after`
/// (seconds or HTTP-date); on a 429 only, the rate-limit reset headers as a last resort.
pub(crate) fn retry_after_at(headers: &HeaderMap, now: SystemTime, rate_limited: bool) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return seconds(ms / 1000.0);
    }
    if let Some(value) = header("retry-after") {
        if let Ok(secs) = value.parse::<f64>() {
            return seconds(secs);
        }
        // IMF-fixdate, and the obsolete RFC 850 and asctime forms recipients must accept.
        if let Ok(at) = httpdate::parse_http_date(value) {
            return Some(at.duration_since(now).unwrap_or_default());
        }
    }
    if !rate_limited {
        return None;
    }
    // Prefer the limits that are exhausted; if none says so, the longest reset is the safe bet.
    let limits = ["requests", "tokens", "input-tokens", "output-tokens"];
    let mut resets: Vec<(bool, Duration)> = Vec::new();
    for limit in limits {
        let openai = header(&format!("x-ratelimit-reset-{limit}")).and_then(parse_go_duration);
        let openai_left = header(&format!("x-ratelimit-remaining-{limit}"));
        let anthropic = header(&format!("anthropic-ratelimit-{limit}-reset"))
            .and_then(parse_rfc3339)
            .map(|at| at.duration_since(now).unwrap_or_default());
        let anthropic_left = header(&format!("anthropic-ratelimit-{limit}-remaining"));
        resets.extend(openai.map(|d| (openai_left == Some("0"), d)));
        resets.extend(anthropic.map(|d| (anthropic_left == Some("0"), d)));
    }
    let exhausted = resets.iter().filter(|(zero, _)| *zero).map(|(_, d)| *d).max();
    exhausted.or_else(|| resets.iter().map(|(_, d)| *d).max())
}

fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs).ok()
}

/// Go-style durations as OpenAI sends them: `20ms`, `1s`, `6m0s`, `1.5s`, `1h2m3s`.
fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0_f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    seconds(total)
}

/// RFC 3339 as Anthropic sends it: `2025-08-21T12:40:59Z`, with optional fraction and offset.
fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let (date, rest) = text.split_at_checked(10)?;
    let mut ymd = date.split('-');
    let (year, month, day) = (
        ymd.next()?.parse().ok()?,
        ymd.next()?.parse().ok()?,
        ymd.next()?.parse().ok()?,
    );
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    let (time, rest) = rest.split_at_checked(8)?;
    let (h, m, s) = parse_hms(time)?;
    let rest = match rest.strip_prefix('.') {
        Some(frac) => frac.trim_start_matches(|c: char| c.is_ascii_digit()),
        None => rest,
    };
    let offset_secs: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.chars().next()? {
                '+' => 1,
                '-' => -1,
                _ => return None,
            };
            let (oh, om) = rest[1..].split_once(':')?;
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60)
        }
    };
    to_system_time(year, month, day, h, m, s, offset_secs)
}

fn parse_hms(time: &str) -> Option<(u32, u32, u32)> {
    let mut it = time.split(':');
    let hms = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    (it.next().is_none() && hms.0 < 24 && hms.1 < 60 && hms.2 < 61).then_some(hms)
}

fn to_system_time(year: i64, month: u32, day: u32, h: u32, m: u32, s: u32, offset: i64) -> Option<SystemTime> {
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from 1970-01-01 (H. Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(month) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + i64::from(h * 3600 + m * 60 + s) - offset;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testkit::headers;

    #[test]
    fn retry_after_http_date_is_relative_to_now() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_767); // Sun, 06 Nov 1994 08:49:27 GMT
        let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")]);
        assert_eq!(retry_after_at(&h, now, true), Some(Duration::from_secs(10)));
        let rfc850 = headers(&[("retry-after", "Sunday, 06-Nov-94 08:49:37 GMT")]);
        assert_eq!(
            retry_after_at(&rfc850, now, true),
            Some(Duration::from_secs(10)),
            "the obsolete RFC 850 form is accepted too"
        );
        let past = headers(&[("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT")]);
        assert_eq!(
            retry_after_at(&past, now, true),
            Some(Duration::ZERO),
            "a past date means now"
        );
    }

    #[test]
    fn openai_reset_headers_are_go_durations() {
        let h = headers(&[
            ("x-ratelimit-remaining-requests", "4999"),
            ("x-ratelimit-reset-requests", "20ms"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        assert_eq!(
            retry_after_at(&h, SystemTime::now(), true),
            Some(Duration::from_secs(360)),
            "exhausted limit wins"
        );
        assert_eq!(
            retry_after_at(&h, SystemTime::now(), false),
            None,
            "reset headers only count on a 429"
        );
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("1h2m3s"), Some(Duration::from_secs(3723)));
        assert_eq!(parse_go_duration("soon"), None);
    }

    #[test]
    fn anthropic_reset_headers_are_rfc3339() {
        let now = parse_rfc3339("2025-08-21T12:40:00Z").unwrap_or(UNIX_EPOCH);
        assert_ne!(now, UNIX_EPOCH, "rfc3339 parses");
        let h = headers(&[
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            ("anthropic-ratelimit-input-tokens-reset", "2025-08-21T12:40:59Z"),
            ("anthropic-ratelimit-requests-remaining", "999"),
            ("anthropic-ratelimit-requests-reset", "2025-08-21T12:40:01.5+00:00"),
        ]);
        assert_eq!(retry_after_at(&h, now, true), Some(Duration::from_secs(59)));
        assert_eq!(
            parse_rfc3339("2025-08-21T14:40:00+02:00"),
            Some(now),
            "offsets are applied"
        );
    }
}
