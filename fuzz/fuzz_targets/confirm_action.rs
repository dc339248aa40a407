//! Fuzzes the CONFIRM_ACTION parser: it never panics, and what it returns
//! agrees with the documented rules.
#![no_main]

use chatgate::protocol::{parse_reply, CONFIRM_PREFIX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|message: &str| {
    match parse_reply(message) {
        None => assert!(!message.starts_with(CONFIRM_PREFIX)),
        Some(Err(_)) => assert!(message.starts_with(CONFIRM_PREFIX)),
        Some(Ok(reply)) => {
            assert!(message.starts_with("CONFIRM_ACTION:"));
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
