//! Reading structure out of a fuzzer's bytes: a cursor that never fails (missing bytes read as
//! zero or empty), so every input means something and small mutations stay meaningful.

pub(crate) struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Input { rest: data }
    }

    pub(crate) fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((&b, rest)) => {
                self.rest = rest;
                b
            }
            None => 0,
        }
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// Up to `n` bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.rest.split_at(n.min(self.rest.len()));
        self.rest = rest;
        head
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        self.bytes(usize::MAX)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}
