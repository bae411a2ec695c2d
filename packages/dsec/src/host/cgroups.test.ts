import assert from 'node:assert/strict';
import { test } from 'node:test';
import { v1HierarchyNames } from './cgroups.js';

test('v1HierarchyNames names each v1 hierarchy of /proc/<pid>/cgroup as crun names its dir under /sys/fs/cgroup', () => {
  const text = [
    '12:cpuacct,cpu:/a',
    '11:net_prio,net_cls:/',
    '10:hugetlb:/',
    '9:name=systemd:/user.slice',
    '4:memory:/process_api/8ff9',
    '3:cpuset:/',
    '0::/',
    '',
  ].join('\n');
  assert.deepEqual(v1HierarchyNames(text), ['cpu,cpuacct', 'cpuset', 'hugetlb', 'memory', 'net_cls,net_prio', 'systemd']);
  assert.deepEqual(v1HierarchyNames('0::/init.scope\n'), [], 'a cgroup2-only host has none');
});
