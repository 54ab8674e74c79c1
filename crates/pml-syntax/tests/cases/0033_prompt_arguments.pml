<prompt schema="travel">
  <system>Be concise &amp; friendly.</system>
  <travel-plan duration="3 &lt; 4 days" note='it&apos;s "fine"'/>
  Compare: a<b and c>d; 0 <= x < n.
</prompt>
