//! Fuzzes the CONFIRM_ACTION parser: it never panics, and what it returns
//! agrees with the documented rules (the prefix in any letter case).
#![no_main]

use chatgate::protocol::{parse_reply, CONFIRM_PREFIX};
use libfuzzer_sys::fuzz_target;

fn starts_with_ignoring_case(message: &str, prefix: &str) -> bool {
    message
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

fuzz_target!(|message: &str| {
    let prefixed = starts_with_ignoring_case(message, CONFIRM_PREFIX);
    match parse_reply(message) {
        None => assert!(!prefixed),
        Some(Err(_)) => assert!(prefixed),
        Some(Ok(reply)) => {
            assert!(starts_with_ignoring_case(message, "CONFIRM_ACTION:"));
            assert!(!reply.action.is_empty());
            assert_eq!(reply.action, reply.action.trim());
            assert_eq!(reply.action, reply.action.to_lowercase());
            assert!(!reply.action.contains(':'));
            if let Some(text) = &reply.text {
                assert!(message.ends_with(text.as_str()));
            }
        }
    }
});
