//! The channels of a link. Every message travels on one channel, and each channel has its
//! own sequence numbers, acknowledgements and window, so channels never wait for each
//! other: a message is delivered exactly once and in order within its channel. Messages are
//! cut into packets that interleave on the connection, so a large message on one channel
//! delays an urgent one on another by at most about one packet.
//!
//! | channel | carries |
//! | --- | --- |
//! | 0 | the system class (always written first) |
//! | 1..=10 | user priority levels 0..=9 |
//! | 11 | files' chunks |
//!
//! Acknowledgements, NAKs, pings and pongs are not on a channel: they go out ahead of any
//! packet waiting to be written.

/// Channels on every link.
pub const CHANNELS: usize = 12;
/// The system class's channel, served before any other.
pub const SYSTEM_CHANNEL: u8 = 0;
/// The channel of file messages.
pub const FILE_CHANNEL: u8 = 11;
/// Equal weights for every channel (the host sets the levels' quotas over them).
pub const EQUAL_WEIGHTS: [u32; CHANNELS] = [1; CHANNELS];

/// The channel of a message with the priority of wire code `priority_code` (levels 0..=9;
/// 10 is the system class), or the file channel for a file's chunks (a file message of the
/// system class, a transfer's small answers, goes on the system channel).
pub fn channel_for(priority_code: u8, file: bool) -> u8 {
    match (file, priority_code) {
        (true, 0..=9) => FILE_CHANNEL,
        (false, level @ 0..=9) => level + 1,
        (_, _) => SYSTEM_CHANNEL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_priority_has_its_own_channel() {
        let channels: Vec<u8> = (0..=10).map(|p| channel_for(p, false)).collect();
        assert_eq!(channels, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, SYSTEM_CHANNEL]);
        assert_eq!(channel_for(3, true), FILE_CHANNEL);
        assert_eq!(channel_for(10, true), SYSTEM_CHANNEL);
        assert!(channels.iter().all(|&c| (c as usize) < CHANNELS));
    }
}
