# perf-split.py SCRIPT MAINPID: the share of the gateway processes' samples
# in the kernel by system call (write/writev, read, epoll_pwait, futex; the
# suffix "(schedule)" when the sample is inside a context switch) and in
# user space by code (Go runtime, relay, syscall wrappers, clock). SCRIPT is
# `perf script -F pid,tid,ip,sym,dso` of `perf record -F 2000 -e cpu-clock
# -g` over a BenchmarkPerMessage run; MAINPID the benchmark process (its
# clients and echo server), left out.
import sys, re, collections
fn=sys.argv[1]; main=sys.argv[2]
cat=collections.Counter(); leafk=collections.Counter(); leafu=collections.Counter()
tot=0
def flush(pid,frames):
  global tot
  if pid is None or pid==main or not frames: return
  tot+=1
  kern = '[kernel' in frames[0][1]
  names=[f[0] for f in frames]
  if kern:
    sc=None
    for i,n in enumerate(names):
      if n in ('do_syscall_64','x64_sys_call') and i>0:
        c=names[i-1] if names[i-1]!='x64_sys_call' else names[i-2]
        sc=re.sub(r'^(__x64_sys_|ksys_|do_|__do_sys_)','',c); break
    sw=any(n in('__schedule','schedule','finish_task_switch.isra.0','finish_task_switch') for n in names)
    if sc is None:
      sc='no-syscall:'+('irq/softirq' if any('irq' in n for n in names) else 'other')
      if any('exit_to_user_mode' in n or 'irqentry' in n for n in names): sc='no-syscall:'+('sched' if sw else 'exit-to-user')
      if any(n.startswith('asm_exc_page_fault') or n=='exc_page_fault' for n in names): sc='no-syscall:page-fault'
    if sc in('writev','write','sendmsg','sendto'): sc='write/writev'
    if sc in('read','readv','recvfrom','recvmsg'): sc='read'
    cat['kernel '+sc+(' (schedule)' if sw else '')]+=1
    leafk[names[0]]+=1
  else:
    n=names[0]
    if 'mpi5k/relay' in n: b='relay'
    elif 'mpi5k/gateway' in n: b='gateway'
    elif n.startswith('runtime.') or n.startswith('internal/runtime'): b='Go runtime'
    elif n.startswith('syscall.') or 'x/sys/unix' in n or n.startswith('internal/poll') or n.startswith('internal/syscall'): b='syscall glue/poll'
    elif '[vdso]' in frames[0][1] or 'vdso' in n: b='vdso (time)'
    elif n.startswith('net.') : b='net'
    elif n.startswith('sync') or n.startswith('time.'): b=n.split('.')[0]
    else: b='other: '+n.split('(')[0][:40]
    # inclusive: is relay code on the stack?
    cat['user '+b]+=1
    leafu[n]+=1
pid=None; frames=[]
for l in open(fn):
  if not l.strip():
    flush(pid,frames); pid=None; frames=[]; continue
  if not l.startswith('\t') and not l.startswith(' '):
    flush(pid,frames); pid=l.split('/')[0].strip(); frames=[]; continue
  p=l.strip().split(None,1)
  if len(p)<2: continue
  sym,_,dso=p[1].rpartition(' (')
  frames.append((sym,dso))
flush(pid,frames)
print('gateway samples',tot)
k=sum(v for c,v in cat.items() if c.startswith('kernel')); print('kernel %.1f%%  user %.1f%%'%(100*k/tot,100*(tot-k)/tot))
for c,v in cat.most_common(): 
  if v/tot>0.003: print('  %5.1f%% %s'%(100*v/tot,c))
print('top kernel leaves'); [print('  %5.1f%% %s'%(100*v/tot,c)) for c,v in leafk.most_common(15)]
print('top user leaves'); [print('  %5.1f%% %s'%(100*v/tot,c)) for c,v in leafu.most_common(25)]
