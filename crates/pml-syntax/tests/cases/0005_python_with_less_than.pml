<schema name="py">
  <module name="search.py">
    def bisect(a, x):
        lo, hi = 0, len(a)
        while lo < hi:
            mid = (lo + hi) // 2
            if a[mid] <= x and 0 <= mid < hi:
                lo = mid + 1
            elif a<b and c>d:
                hi = mid
        return lo
    print(1 <2)
  </module>
</schema>
