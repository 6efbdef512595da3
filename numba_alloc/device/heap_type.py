"""The device heap as a kernel argument on a GPU: the Numba extension type
:class:`DeviceHeapType` (its data and meta arrays, passed as a tuple's
are) whose ``malloc``/``malloc_warp``/``free``/``view`` call heap_kernels'
functions, and making DeviceHeap instances kernel arguments of it. Under the CUDA
simulator there is none: kernels get the host object, whose methods run
the same functions as Python."""

import operator

import numpy as np

from .heap_kernels import SIMULATOR, heap_free, heap_malloc, heap_malloc_warp, view_bounds


def _register_extension():
    from numba.cuda import types
    from numba.cuda import cgutils
    from numba.cuda.core.imputils import impl_ret_borrowed
    from numba.cuda.extending import lower_builtin, make_attribute_wrapper, models, \
        overload_method, register_model, type_callable
    from numba.cuda.np.arrayobj import make_array, populate_array
    from numba.np import numpy_support

    class DeviceHeapType(types.BaseTuple):
        """A device heap as a kernel argument: its bytes (uint8[::1]) and its
        bookkeeping (int64[::1]). A tuple type so that the kernel launch
        passes its arrays as it passes a tuple's."""

        def __init__(self):
            self.types = (types.uint8[::1], types.int64[::1])
            super().__init__(name="DeviceHeap")

        def __len__(self):
            return len(self.types)

        def __iter__(self):
            return iter(self.types)

        def __getitem__(self, i):
            return self.types[i]

        @property
        def key(self):
            return "numba_alloc.DeviceHeap"

    @register_model(DeviceHeapType)
    class DeviceHeapModel(models.StructModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, [("data", fe_type.types[0]),
                                            ("meta", fe_type.types[1])])

    make_attribute_wrapper(DeviceHeapType, "data", "data")
    make_attribute_wrapper(DeviceHeapType, "meta", "meta")

    @overload_method(DeviceHeapType, "malloc", target="cuda")
    def _malloc(heap, nbytes):
        def impl(heap, nbytes):
            return heap_malloc(heap.data, heap.meta, nbytes)
        return impl

    @overload_method(DeviceHeapType, "malloc_warp", target="cuda")
    def _malloc_warp(heap, nbytes):
        def impl(heap, nbytes):
            return heap_malloc_warp(heap.data, heap.meta, nbytes)
        return impl

    @overload_method(DeviceHeapType, "free", target="cuda")
    def _free(heap, off):
        def impl(heap, off):
            heap_free(heap.data, heap.meta, off)
        return impl

    def _item_type(dtype):
        """The Numba type of a view's items from ``view``'s dtype argument."""
        if isinstance(dtype, types.NumberClass):
            return dtype.instance_type
        if isinstance(dtype, types.DType):
            return dtype.dtype
        return None

    # heap.view(off, count, dtype) is inlined into the kernel as the getitem
    # heap[start, items, dtype], so that the view aliases the kernel's heap
    # argument: Numba's dead code elimination (which runs over a kernel once
    # anything is inlined into it) keeps a store through an array only when
    # the array aliases an argument, and it does not know that a .view() call
    # returns an alias. A view made by .view() inside the inlined method lost
    # stores such as words[last] = x on a GPU. A device function cannot
    # return the view instead (Numba returns only arrays passed in).
    @overload_method(DeviceHeapType, "view", target="cuda", inline="always")
    def _view(heap, off, count, dtype):
        item = _item_type(dtype)
        if item is None:
            return None
        itemsize = numpy_support.as_dtype(item).itemsize

        def impl(heap, off, count, dtype):
            start, items = view_bounds(heap.data.size, off, count, itemsize)
            return heap[start, items, dtype]
        return impl

    @type_callable(operator.getitem)
    def _type_items(context):
        def typer(heap, index):
            if (isinstance(heap, DeviceHeapType) and isinstance(index, types.BaseTuple)
                    and len(index) == 3 and _item_type(index[2]) is not None):
                return types.Array(_item_type(index[2]), 1, "C")
        return typer

    @lower_builtin(operator.getitem, DeviceHeapType, types.BaseTuple)
    def _lower_items(context, builder, sig, args):
        """heap[start, items, dtype]: ``items`` items of ``dtype`` from byte
        ``start`` of the heap's data (both already within it)."""
        heap_type, index_type = sig.args
        heap = cgutils.create_struct_proxy(heap_type)(context, builder, value=args[0])
        data = make_array(heap_type.types[0])(context, builder, value=heap.data)
        start = context.cast(builder, builder.extract_value(args[1], 0), index_type[0],
                             types.intp)
        items = context.cast(builder, builder.extract_value(args[1], 1), index_type[1],
                             types.intp)
        out = make_array(sig.return_type)(context, builder)
        item_pointer = context.get_value_type(sig.return_type.dtype).as_pointer()
        itemsize = context.get_abi_sizeof(context.get_data_type(sig.return_type.dtype))
        populate_array(out, data=builder.bitcast(builder.gep(data.data, [start]), item_pointer),
                       shape=[items], strides=[context.get_constant(types.intp, itemsize)],
                       itemsize=context.get_constant(types.intp, itemsize),
                       meminfo=data.meminfo, parent=data.parent)
        return impl_ret_borrowed(context, builder, sig.return_type, out._getvalue())

    device_heap_type = DeviceHeapType()
    return DeviceHeapType, device_heap_type


DeviceHeapType = device_heap_type = None
if not SIMULATOR:
    DeviceHeapType, device_heap_type = _register_extension()


def register_argument(cls):
    """Make instances of ``cls`` (DeviceHeap) kernel arguments of
    DeviceHeapType (on a GPU; the simulator passes them as they are)."""
    if device_heap_type is None:
        return
    from numba.cuda.extending import typeof_impl

    @typeof_impl.register(cls)
    def _typeof_heap(heap, context):
        heap._check_kernel_argument()
        return device_heap_type


def as_dtype(dtype):
    """A NumPy dtype from a NumPy one or a Numba type (the simulator's view).
    TypeError for anything a GPU kernel's view does not take either (a
    string such as "float32")."""
    from numba.core import types
    if not isinstance(dtype, (type, np.dtype, types.Type)):
        raise TypeError(f"dtype must be a NumPy or Numba type (np.float32, numba.float32) or "
                        f"a np.dtype, as a kernel on a GPU takes, got {dtype!r}")
    if isinstance(dtype, types.NumberClass):
        dtype = dtype.instance_type
    if isinstance(dtype, types.Type):
        from numba.np import numpy_support
        return numpy_support.as_dtype(dtype)
    return np.dtype(dtype)
