//! The tensor a stream all-reduces: borrowed, owned or generated block by block.

/// The tensor being all-reduced: borrowed, owned (handed back by
/// [`Stream::into_tensor`](crate::stream::Stream::into_tensor)) or generated ([`Source`]). The
/// result replaces it.
#[derive(Debug)]
pub enum Tensor<'a> {
    F32(&'a mut [f32]),
    I32(&'a mut [i32]),
    F32Owned(Vec<f32>),
    I32Owned(Vec<i32>),
    /// Float32 elements made on demand and the result handed back, block by block.
    Generated(&'a mut (dyn Source + Send)),
    /// The support of a sparse all-reduce (PROTOCOL.md §5, "Sparse streams"; made by
    /// `crate::sparse::support`): int32 counts, with the element type of the tensor whose
    /// support it is (float32 if `true`), which the descriptor names.
    Support(&'a mut [i32], bool),
    /// Some blocks of a tensor, read and written in place: the values stream of a sparse
    /// all-reduce (PROTOCOL.md §5, "Sparse streams"). `blocks` are increasing indices of
    /// blocks of `elems_per_block` elements (the stream's elements per packet); the stream
    /// carries them one after the other and leaves every other element alone.
    Blocks {
        of: Box<Tensor<'a>>,
        blocks: Vec<usize>,
        elems_per_block: usize,
    },
}

/// A float32 tensor that is never held whole (see [`Tensor::Generated`]).
pub trait Source: core::fmt::Debug {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Writes input elements `start..start + out.len()` into `out`. Called as often as a block
    /// is needed (for its exponent, then for its data): the same elements every time.
    fn input(&mut self, start: usize, out: &mut [f32]);
    /// Takes result elements `start..start + values.len()`, once per block, in any order.
    fn result(&mut self, start: usize, values: &[f32]);
}

impl<S: Source + ?Sized> Source for &mut S {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn input(&mut self, start: usize, out: &mut [f32]) {
        (**self).input(start, out)
    }
    fn result(&mut self, start: usize, values: &[f32]) {
        (**self).result(start, values)
    }
}

/// A read view of a tensor's elements.
#[derive(Debug, Clone, Copy)]
pub enum Elements<'t> {
    F32(&'t [f32]),
    I32(&'t [i32]),
}

/// A write view of a tensor's elements.
#[derive(Debug)]
pub enum ElementsMut<'t> {
    F32(&'t mut [f32]),
    I32(&'t mut [i32]),
}

impl Tensor<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Tensor::F32(t) => t.len(),
            Tensor::I32(t) | Tensor::Support(t, _) => t.len(),
            Tensor::F32Owned(t) => t.len(),
            Tensor::I32Owned(t) => t.len(),
            Tensor::Generated(g) => g.len(),
            Tensor::Blocks {
                of,
                blocks,
                elems_per_block,
            } => {
                let (len, e) = (of.len(), (*elems_per_block).max(1));
                let block = |b: usize| e.min(len.saturating_sub(b.saturating_mul(e)));
                blocks.iter().map(|&b| block(b)).sum()
            }
        }
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the elements are float32 (and so use the exponent lookahead).
    pub fn is_float(&self) -> bool {
        match self {
            Tensor::I32(_) | Tensor::I32Owned(_) | Tensor::Support(..) => false,
            Tensor::Blocks { of, .. } => of.is_float(),
            _ => true,
        }
    }

    /// The elements (of the whole tensor, for [`Tensor::Blocks`]); `None` for a generated
    /// tensor, which has none in memory.
    pub fn elements(&self) -> Option<Elements<'_>> {
        Some(match self {
            Tensor::Blocks { of, .. } => return of.elements(),
            Tensor::F32(t) => Elements::F32(t),
            Tensor::I32(t) | Tensor::Support(t, _) => Elements::I32(t),
            Tensor::F32Owned(t) => Elements::F32(t),
            Tensor::I32Owned(t) => Elements::I32(t),
            Tensor::Generated(_) => return None,
        })
    }

    /// The elements, writable; `None` for a generated tensor.
    pub fn elements_mut(&mut self) -> Option<ElementsMut<'_>> {
        Some(match self {
            Tensor::Blocks { of, .. } => return of.elements_mut(),
            Tensor::F32(t) => ElementsMut::F32(t),
            Tensor::I32(t) | Tensor::Support(t, _) => ElementsMut::I32(t),
            Tensor::F32Owned(t) => ElementsMut::F32(t),
            Tensor::I32Owned(t) => ElementsMut::I32(t),
            Tensor::Generated(_) => return None,
        })
    }
}
