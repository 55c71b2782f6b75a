#!/usr/bin/env python3
"""The data flow of `gdn_chunk_state_coop` (crates/wgpu/src/gdn/chunks_state_coop.wgsl).

Emulates one workgroup (one head, one 16-column tile, K = 128, three chunks) with the kernel's
workgroup arrays, strides and offsets, cooperative loads (row-major `coopLoadT`, column-major
`coopLoad`) and stores, each subgroup's share of every product and the partial sums, in f64
(no f16 rounding: tools/coop-lab/emulate.py covers the numerics), against the chunk algorithm.
Prints the largest differences of o and of the final state (rounding-level when the index
math is right).

    python3 tools/coop-lab/state_kernel_dataflow.py
"""
import numpy as np
rng=np.random.default_rng(3)
K=128; V=16; CT=32; A_STRIDE=136; B_STRIDE=24
def loadT(arr, off, stride):  # row-major 16x16
    return np.array([[arr[off + i*stride + j] for j in range(16)] for i in range(16)])
def load(arr, off, stride):   # column-major: (i,j) at off + j*stride + i
    return np.array([[arr[off + j*stride + i] for j in range(16)] for i in range(16)])
def storeT(m, arr, off, stride):
    for i in range(16):
        for j in range(16):
            arr[off + i*stride + j] = m[i, j]
chunks=3
S0=rng.standard_normal((K,V))
Ws=[rng.standard_normal((CT,K))*0.1 for _ in range(chunks)]
Qs=[rng.standard_normal((CT,K))*0.1 for _ in range(chunks)]
Kds=[rng.standard_normal((CT,K))*0.1 for _ in range(chunks)]
Ps=[np.tril(rng.standard_normal((CT,CT))) for _ in range(chunks)]
Us=[rng.standard_normal((CT,V)) for _ in range(chunks)]
decays=[0.9,0.8,0.7]
# reference
S=S0.copy(); Oref=[]
for n in range(chunks):
    vn=Us[n]-Ws[n]@S
    Oref.append(Qs[n]@S+Ps[n]@vn)
    S=decays[n]*S+Kds[n].T@vn
Sref=S
# kernel emulation
co_s=np.zeros(2048); co_s_h=np.zeros(3072); co_a=np.zeros(4352); co_v=np.zeros(512); co_v_h=np.zeros(768); co_part=np.zeros(1024)
for r in range(K):
    for c in range(16): co_s[r*16+c]=S0[r,c]
def stage(M):
    co_a[:]=0
    for i in range(M.shape[0]):
        for j in range(M.shape[1]): co_a[i*A_STRIDE+j]=M[i,j]
def rows_times_s(g):
    row0=(g&1)*16; half=K//2; kf=(g>>1)*half
    acc=np.zeros((16,16))
    for step in range(0,half,16):
        k0=kf+step
        acc+=loadT(co_a,row0*A_STRIDE+k0,A_STRIDE)@loadT(co_s_h,k0*B_STRIDE,B_STRIDE)
    storeT(acc,co_part,(g>>1)*512+row0*16,16)
O=[]
for n in range(chunks):
    for e in range(K*16): co_s_h[(e//16)*B_STRIDE+e%16]=co_s[e]
    stage(Ws[n])
    for g in range(4): rows_times_s(g)
    for e in range(CT*8):
        row=e//8; cp=e%8; at=row*16+2*cp
        ws=np.array([co_part[at]+co_part[512+at], co_part[at+1]+co_part[513+at]])
        vn=Us[n][row,2*cp:2*cp+2]-ws
        co_v[at]=vn[0]; co_v[at+1]=vn[1]
        co_v_h[row*B_STRIDE+2*cp]=vn[0]; co_v_h[row*B_STRIDE+2*cp+1]=vn[1]
    stage(Qs[n])
    for g in range(4): rows_times_s(g)
    stage(Ps[n])
    newpart=co_part.copy()
    for g in range(4):
        row0=(g&1)*16; j0=(g>>1)*16
        high=loadT(co_part,(g>>1)*512+row0*16,16)
        high=high+loadT(co_a,row0*A_STRIDE+j0,A_STRIDE)@loadT(co_v_h,j0*B_STRIDE,B_STRIDE)
        storeT(high,newpart,(g>>1)*512+row0*16,16)
    co_part=newpart
    On=np.zeros((CT,16))
    for e in range(CT*8):
        row=e//8; cp=e%8; at=row*16+2*cp
        On[row,2*cp]=co_part[at]+co_part[512+at]; On[row,2*cp+1]=co_part[at+1]+co_part[513+at]
    O.append(On)
    stage(Kds[n])
    for g in range(4):
        for i in range(K//64):
            r0=16*(g+4*i)
            high=loadT(co_s,r0*16,16)*decays[n]
            for j0 in range(0,CT,16):
                high=high+load(co_a,j0*A_STRIDE+r0,A_STRIDE)@loadT(co_v_h,j0*B_STRIDE,B_STRIDE)
            storeT(high,co_s,r0*16,16)
Semu=co_s[:K*16].reshape(K,16)
print("o max err", max(np.abs(O[n]-Oref[n]).max() for n in range(chunks)), "state max err", np.abs(Semu-Sref).max())
